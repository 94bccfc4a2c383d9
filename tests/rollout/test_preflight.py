"""Every config error of a rollout job surfaces in the driver, before Ray starts, with the
project's message and the override to change; every valid bundled config passes, quickly."""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import re
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from agent_memory.config import ConfigError, load_job, register_configs
from agent_memory.memory.notes import NotesMemory
from agent_memory.policies import policy_factory
from agent_memory.prompts import PromptTemplate
from agent_memory.rollout import run_rollout
from agent_memory.rollout.driver.layout_checks import append_only_error
from agent_memory.rollout.driver.preflight import preflight

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
# The bundled envs' configs; gym.yaml (your own env, no id) is tested in test_own_env.py, and
# openenv.yaml (a server's env: no oracle, a URL to give) in tests/envs/test_openenv.py.
ENVS = sorted(p.stem for p in (CONFIGS / "env").glob("*.yaml") if p.stem not in ("gym", "openenv"))
MEMORIES = sorted(p.stem for p in (CONFIGS / "memory").glob("*.yaml"))

register_configs()


def _job(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return load_job(compose(config_name="config", overrides=list(overrides)))


def _check(*overrides: str, probe: bool = True):
    """load_job then preflight, as scripts/rollout.py does before Ray starts."""
    report = preflight(_job(*overrides), probe=probe)
    report.policy.close()
    return report


def _frame(task: str = "", memory_instructions: str = "") -> int:
    """The default template's frame by the estimate counter (ceil(chars / 4)), with the words a
    memory the policy writes adds to every prompt."""
    text = PromptTemplate(task=task).render(observation="", memory_instructions=memory_instructions)
    return math.ceil(len(text) / 4)


@pytest.fixture
def nothing_heavy_is_built(monkeypatch):
    """Preflight builds no env (TextWorld generates games, Code starts a sandbox when built)
    and no sandbox: here each bundled env class's constructor, and the sandbox's, raises and
    is counted (in case a caller swallowed the error). Yields the names of those built."""
    from gymnasium.envs.registration import load_env_creator

    from agent_memory.envs import ENVS
    from agent_memory.envs.code_exec import Sandbox

    creators = {load_env_creator(entry) for entry, _, _ in ENVS.values()}
    heavy = [c for c in creators if isinstance(c, type)] + [Sandbox]
    built: list[str] = []
    for cls in heavy:

        def refuse(self, *args, _name=cls.__qualname__, **kwargs):
            built.append(_name)
            raise AssertionError(f"preflight built a {_name}")

        functools.update_wrapper(refuse, cls.__init__)  # the signature preflight binds to
        monkeypatch.setattr(cls, "__init__", refuse)
    yield built


@pytest.fixture(autouse=True)
def _ray_stays_down():
    """No check may start Ray (when another test module already started it, this says nothing;
    test_preflight_never_imports_ray covers a fresh interpreter)."""
    ray = pytest.importorskip("ray")
    was_up = ray.is_initialized()
    yield
    assert ray.is_initialized() == was_up


#: A case past the 'llm' extra's check: without it, preflight says to install it instead.
NEEDS_LLM = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")),
    reason="the 'llm' extra is not installed",
)

# (overrides, the message pinned: what is wrong and the override to change)
INVALID = [
    pytest.param(
        ["env.id=NoSuch-v0"],
        "env.id='NoSuch-v0' is not a registered Gymnasium id (Environment `NoSuch` doesn't "
        "exist.): pass a registered id (bundled: agent_memory/CliffWalking-v0, ",
        id="unknown-gym-id",
    ),
    pytest.param(
        ["env.id=agent_memory/Sokobon-v0"],
        "did you mean env.id=agent_memory/Sokoban-v0? Otherwise, pass a registered id",
        id="misspelled-gym-id",
    ),
    pytest.param(
        ["env.id=no_such_module:NoSuch-v0"],
        "env.id='no_such_module:NoSuch-v0': module 'no_such_module' does not import "
        "(ModuleNotFoundError: No module named 'no_such_module'); 'module:Id' imports the module "
        "that registers Id: fix the module name in env.id, or pass a registered id, "
        "e.g. env.id=agent_memory/Sokoban-v0",
        id="module-that-does-not-import",
    ),
    pytest.param(
        ["+env.kwargs.dim_rom=[5,5]"],
        "env.kwargs has no parameter 'dim_rom' for env 'agent_memory/Sokoban-v0' "
        "(agent_memory.envs.sokoban.env.SokobanEnv): did you mean env.kwargs.dim_room=[5,5]? Valid: ['dim_room', ",
        id="env-kwarg-typo",
    ),
    pytest.param(
        ["env=frozen_lake", "+env.kwargs.slippery=true"],
        "env.kwargs has no parameter 'slippery' for env 'agent_memory/FrozenLake-v0' "
        "(agent_memory.envs.toy_text.make_frozen_lake): did you mean env.kwargs.is_slippery=true?",
        id="env-kwarg-typo-factory",
    ),
    pytest.param(
        ["+env.kwargs.max_episode_steps=3", "env.max_steps=4"],
        "env.kwargs.max_episode_steps and env.max_steps both set the step limit: remove "
        "env.kwargs.max_episode_steps",
        id="two-step-limits",
    ),
    pytest.param(
        ["+memory.params.top_kk=3"],
        "memory.params has no parameter 'top_kk' for strategy 'window': remove "
        "memory.params.top_kk (top_k is a parameter of strategy episodic, retrieval: "
        "e.g. memory=retrieval ++memory.params.top_k=3). Valid: []",
        id="memory-param-of-another-strategy",
    ),
    pytest.param(
        # blackboard's constructor takes a clock function, which no config sets: no hint to it
        ["+memory.params.clock=3"],
        "memory.params has no parameter 'clock' for strategy 'window': remove "
        "memory.params.clock (strategy 'window' takes no such parameter). Valid: []",
        id="a-constructor-argument-is-no-other-strategys-setting",
    ),
    pytest.param(
        ["memory=retrieval", "+memory.params.top_kk=3"],
        "memory.params has no parameter 'top_kk' for strategy 'retrieval': did you mean "
        "memory.params.top_k=3? Valid: ['top_k', 'similarity_threshold', ",
        id="memory-param-typo",
    ),
    pytest.param(
        ["+memory.params.max_history_tokens=64"],
        "memory.params.max_history_tokens is set by memory.max_history_tokens, not by memory.params: remove "
        "memory.params.max_history_tokens",
        id="memory-param-set-elsewhere",
    ),
    pytest.param(
        ["memory=retrieval", "memory.params.top_k=-1"],
        "memory.strategy='retrieval' cannot be built: top_k must be an int >= 0, got -1: "
        "change memory.params.top_k",
        id="memory-param-value",
    ),
    pytest.param(
        ["memory=compaction", "memory.params.keep_last=9"],
        "got keep_last=9, trigger_steps=8: change memory.params.keep_last or "
        "memory.params.trigger_steps",
        id="compaction-keep-last",
    ),
    pytest.param(
        ["+policy.params.sed=3"],
        "policy.params has no parameter 'sed' for policy 'random': did you mean "
        "+policy.params.seed=3? Valid: ['seed', 'actions']",
        id="policy-param-typo",
    ),
    pytest.param(
        ["memory.strategy=retrival"],
        "memory.strategy='retrival' is not a registered memory strategy: did you mean "
        "memory.strategy=retrieval? Registered: ['blackboard', ",
        id="unknown-memory-strategy",
    ),
    pytest.param(
        ["env.formatter=simpel"],
        "env.formatter='simpel' is not a registered formatter: did you mean env.formatter=simple? "
        "Registered: ['chat', 'code', 'jinja', 'search', 'simple'",
        id="unknown-formatter",
    ),
    pytest.param(
        ["env=code", "+env.formatter.max_char=100"],
        "env.formatter has no parameter 'max_char' for formatter 'code': did you mean "
        "env.formatter.max_chars=100?",
        id="formatter-setting-typo",
    ),
    pytest.param(
        ["memory.token_counter=estimat"],
        "memory.token_counter='estimat' cannot be built (ValueError: unknown token counter "
        "'estimat': expected one of ['chars', 'default', 'estimate', 'hf', 'qwen']",
        id="unknown-token-counter",
    ),
    pytest.param(
        ["memory.token_counter=hf:/no/such/tokenizer"],
        "memory.token_counter='hf:/no/such/tokenizer' cannot be built (FileNotFoundError: "
        "tokenizer path '/no/such/tokenizer' does not exist",
        id="missing-tokenizer",
        marks=NEEDS_LLM,
    ),
    pytest.param(
        ["env.template.no_history='Now: {observaton}'"],
        "the prompt template cannot be built: prompt template 'no_history' uses unknown "
        "field(s) ['observaton']: expected some of ",
        id="unknown-template-field",
    ),
    pytest.param(
        ["env.template.with_history='{observaton} {history}'"],
        "; did you mean {observation}?: change env.template.with_history",
        id="template-field-typo-suggests",
    ),
    pytest.param(
        ["memory=conversation"],
        "memory.strategy='conversation' cannot be built: the conversation memory stores chat "
        "messages: formatter must have output 'messages' (e.g. 'chat'), got 'simple' "
        "(output 'text'): change env.formatter",
        id="conversation-with-text-formatter",
    ),
    pytest.param(
        ["memory=full", "memory.bounded=true"],
        "memory.bounded=true keeps only history_length steps, but the history length is -1 "
        "(whole episode): pass memory.bounded=false or a window, e.g. env.history_length=3",
        id="full-and-bounded",
    ),
    pytest.param(
        ["env.history_length=-1", "memory.bounded=true"],
        "memory.bounded=true keeps only history_length steps, but the history length is -1",
        id="minus-one-and-bounded",
    ),
    pytest.param(
        ["memory=episodic", "memory.params.retention=forever"],
        "memory.strategy='episodic' cannot be built: retention must be one of ['single_run', "
        "'session', 'persistent'], got 'forever': change memory.params.retention",
        id="episodic-retention",
    ),
    pytest.param(
        ["memory=episodic", "memory.params.retention=session"],
        "retention='session' needs a session_id (shared by the runs of the session), got None: "
        "change memory.params.retention or memory.params.session_id",
        id="episodic-session-without-id",
    ),
    pytest.param(
        ["env=recall", "memory=token_budget", "memory.max_prompt_tokens=20"],
        f"the prompt cannot be built: max_prompt_tokens=20 is below the prompt's frame: the "
        f"template alone (empty observation, no history) takes {_frame()} tokens (estimate:4), "
        f"so every prompt would exceed the budget: expected max_prompt_tokens >= {_frame()} plus "
        "room for observations and history, or None (no budget): change memory.max_prompt_tokens",
        id="budget-below-frame",
    ),
    pytest.param(
        ["env=taxi", "env.id=tests.rollout.flaky:Flaky-v0", "policy=scripted"],
        "policy 'scripted' plays the env's oracle, but env 'Flaky-v0' "
        "(tests.rollout.flaky.FlakyEnv) has no oracle_action(): choose a policy that needs no "
        "oracle, e.g. policy=random, or an env with one, e.g. env=sokoban",
        id="scripted-without-oracle",
    ),
    pytest.param(
        ["env=taxi", "env.id=tests.rollout.flaky:Flaky-v0", "policy=prompt_oracle"],
        "policy 'prompt_oracle' plays the env's oracle, but env 'Flaky-v0'",
        id="prompt-oracle-without-oracle",
    ),
    pytest.param(
        ["policy.name=randm"],
        "policy.name='randm' is not a registered policy: did you mean policy.name=random?",
        id="unknown-policy",
    ),
    pytest.param(
        ["policy=hf"],
        "policy.params.path is required (its config says ???): pass policy.params.path=<value>",
        id="hf-without-path",
    ),
    pytest.param(
        ["policy=openai"],
        "policy.params.model is required (its config says ???): pass policy.params.model=<value>",
        id="openai-without-model",
    ),
    pytest.param(
        ["policy=hf", "policy.params.path=/no/such/model"],
        "policy=hf cannot be built: FileNotFoundError: path must be a directory saved by "
        "save_pretrained() (config.json, weights, tokenizer_config.json)",
        id="hf-missing-model",
        marks=NEEDS_LLM,
    ),
    pytest.param(
        ["+rollout.group_sise=8"],
        "rollout.group_sise is not a config key: did you mean rollout.group_size=8? (keys of "
        "rollout: num_groups, group_size, ",
        id="appended-misspelled-key",
    ),
    pytest.param(
        ["env.parser.on_invalid=noop"],
        "the response parser cannot be built: on_invalid='noop' needs noop_action: ",
        id="parser-noop-without-action",
    ),
    pytest.param(
        ["algo=ppo", "algo.value_fn=no_such_module:values"],
        "algo.value_fn='no_such_module:values' does not resolve: No module named "
        "'no_such_module': pass algo.value_fn=zero, or module:function naming a callable",
        id="ppo-value-fn",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), INVALID)
def test_config_errors_name_the_override(overrides, message, nothing_heavy_is_built):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _check(*overrides)
    assert nothing_heavy_is_built == []  # found without building an env or a sandbox


def test_config_errors_are_value_errors_with_the_key():
    with pytest.raises(ValueError, match="top_kk") as e:
        _check("memory=retrieval", "+memory.params.top_kk=3")
    assert isinstance(e.value, ConfigError) and e.value.key == "memory.params.top_kk"


def test_preflight_never_imports_ray():
    """In a fresh interpreter: the checks fail without even importing Ray."""
    code = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from tests.rollout.test_preflight import INVALID, _check
from agent_memory.config import ConfigError
failed = 0
for case in INVALID:
    overrides = case.values[0]
    try:
        _check(*overrides)
    except ConfigError:
        failed += 1
assert "ray" not in sys.modules, "preflight imported ray"
print(failed)
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) == len(INVALID)


def test_run_rollout_refuses_before_starting_ray(tmp_path):
    # _ray_stays_down checks Ray was not started (when no other test had started it).
    job = _job("env=taxi", "env.id=tests.rollout.flaky:Flaky-v0", "policy=scripted")
    with pytest.raises(ConfigError, match=re.escape("has no oracle_action()")):
        run_rollout(job, tmp_path)
    assert not (tmp_path / "trajectories.jsonl").exists()


# ---------------------------------------------------------------------- valid configs pass


@pytest.mark.parametrize("env", ENVS)
def test_every_env_config_passes(env):
    report = _check(f"env={env}")
    assert report.env.id == _job(f"env={env}").env.id
    assert report.env.env_class is not None and hasattr(report.env.env_class, "oracle_action")


@pytest.mark.parametrize("memory", MEMORIES)
def test_every_memory_config_passes(memory):
    chat = ["env.formatter=chat"] if memory == "conversation" else []
    report = _check("env=recall", f"memory={memory}", *chat)
    # The note's instructions are in every prompt (the default note at Recall's window of 3).
    words = NotesMemory(num_envs=1).instructions(3) if memory == "notes" else ""
    assert report.frame_tokens == _frame(memory_instructions=words)


def test_memory_files_go_to_a_temporary_directory(tmp_path):
    for memory in ("episodic", "blackboard"):
        _check("env=recall", f"memory={memory}", f"memory.params.path={tmp_path}/{memory}.db")
    assert list(tmp_path.iterdir()) == []  # the real path was checked, never opened


@pytest.mark.parametrize("policy", ["random", "scripted", "prompt_oracle"])
@pytest.mark.parametrize("env", ["sokoban", "recall", "code", "textworld"])
def test_offline_policies_pass(policy, env, nothing_heavy_is_built):
    report = _check(f"env={env}", f"policy={policy}")
    assert type(report.policy) is policy_factory(policy)
    # TextWorld generates games and Code starts a sandbox when built: preflight builds neither.
    assert nothing_heavy_is_built == []


def test_hf_policy_is_built_once_in_the_driver(tmp_path):
    from tests.policies.test_hf import _save_model

    path = _save_model(tmp_path / "tiny", "gpt2")
    report = preflight(
        _job(
            "env=recall",
            "policy=hf",
            f"policy.params.path={path}",
            "policy.params.max_new_tokens=8",
            "policy.params.batch_size=2",
        )
    )
    try:
        assert type(report.policy).__name__ == "HFPolicy" and report.policy.batch_size == 2
    finally:
        report.policy.close()
    # The model's own limit (64 positions) is checked by its constructor, in the driver.
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "policy=hf cannot be built: max_new_tokens must be < the model's context length 64 "
            "to leave room for a prompt, got 256: change policy.params.max_new_tokens"
        ),
    ):
        _check("env=recall", "policy=hf", f"policy.params.path={path}")


# ---------------------------------------------------------------------- the openai server probe


class _Models(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        data = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()
        code = 200 if self.path == "/v1/models" else 404
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def models_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_probe_finds_a_live_server(models_server):
    report = _check(
        "policy=openai", "policy.params.model=m", f"policy.params.base_url={models_server}/v1"
    )
    assert report.server_status == 200
    # Any HTTP answer means a server is up (here a 404 for a wrong API root).
    report = _check(
        "policy=openai", "policy.params.model=m", f"policy.params.base_url={models_server}/api"
    )
    assert report.server_status == 404


def test_openai_probe_refuses_a_server_that_is_down():
    url = f"http://127.0.0.1:{_free_port()}/v1"  # nothing listens there
    message = f"policy.params.base_url='{url}': no server answers (GET {url}/models: ConnectError: "
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        _check("policy=openai", "policy.params.model=m", f"policy.params.base_url={url}")
    assert str(e.value).endswith(
        "start the OpenAI-compatible server first, or pass its API root, "
        "e.g. policy.params.base_url=http://localhost:8000/v1"
    )
    report = _check(
        "policy=openai", "policy.params.model=m", f"policy.params.base_url={url}", probe=False
    )
    assert report.server_status is None


# ---------------------------------------------------------------------- rollout.layout=episode

EPISODE = ["env=recall", "rollout.layout=episode"]
#: A chat that only grows: whole history, the model's own conversation, no budget.
GROWING = [*EPISODE, "memory=full", "env.formatter=transcript"]

#: Configs whose chat does not only grow: the episode layout splits their episodes into
#: segments, and the TRL adapter (one completion per prompt) refuses them with this message.
REWRITING = [
    pytest.param(
        EPISODE,
        "rollout.layout=episode trains one sample per episode on the whole conversation, so "
        "every turn's prompt must extend the previous one: it needs the whole history, got "
        "env.history_length=3: pass env.history_length=-1 (or memory=full), or "
        "rollout.layout=step",
        id="window",
    ),
    pytest.param(
        [*EPISODE, "memory=none"],
        "rollout.layout=episode trains one sample per episode on the whole conversation, so "
        "every turn's prompt must extend the previous one: it needs the whole history, got "
        "memory=none (history length 0): pass memory=full, or rollout.layout=step",
        id="no-history",
    ),
    pytest.param(
        [*EPISODE, "memory=compaction", "env.history_length=-1"],
        "so every turn's prompt must extend the previous one, but memory.strategy='compaction' "
        "rewrites earlier turns (it summarises, retrieves or trims them): pass memory=full, or "
        "rollout.layout=step",
        id="rewriting-memory",
    ),
    pytest.param(
        [*GROWING, "memory.max_prompt_tokens=4096"],
        "but memory.max_prompt_tokens=4096 drops the oldest turns once the budget is reached: "
        "pass memory.max_prompt_tokens=null, or rollout.layout=step",
        id="prompt-budget",
    ),
    pytest.param(
        [*EPISODE, "memory=full"],
        "rollout.layout=episode needs the model's own conversation, one message per turn, but "
        "env.formatter='simple' writes the history into each turn's prompt anew: pass "
        "env.formatter=transcript, or rollout.layout=step",
        id="text-formatter",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), REWRITING)
def test_a_chat_that_does_not_only_grow_is_named_with_its_override(overrides, message):
    assert append_only_error(_job(*GROWING)) is None
    error = append_only_error(_job(*overrides))
    assert isinstance(error, ConfigError) and re.search(re.escape(message), str(error))


#: What a policy without token ids is told, whatever the memory.
NO_TOKEN_IDS = (
    "rollout.layout=episode needs the token ids the model saw and sampled, but "
    "policy=random renders no token ids here: pass policy=hf with "
    "policy.params.incremental=true, or policy=openai with policy.params.mode=completion "
    "policy.params.token_in=true policy.params.incremental=true "
    "policy.params.tokenizer=<model path>, or rollout.layout=step"
)


@pytest.mark.parametrize("memory", [[*GROWING], [*EPISODE, "memory=compaction"]])
def test_episode_layout_refuses_a_policy_without_token_ids(memory):
    with pytest.raises(ConfigError, match=re.escape(NO_TOKEN_IDS)):
        _check(*memory, "policy=random")


def test_run_rollout_refuses_the_episode_layout_before_starting_ray(tmp_path):
    # _ray_stays_down checks Ray was not started (when no other test had started it).
    with pytest.raises(ConfigError, match=re.escape("policy=random renders no token ids")):
        run_rollout(_job(*EPISODE, "policy=random"), tmp_path)
    assert not (tmp_path / "trajectories.jsonl").exists()


#: Like the tiny model's template, but an earlier assistant turn is shown as "done" (as
#: templates that drop past reasoning do): adding a turn re-renders the previous one.
REWRITING_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} : {% if m['role'] == 'assistant' and not "
    "loop.last %}done{% else %}{{ m['content'] }}{% endif %} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant :{% endif %}"
)


def test_episode_layout_checks_the_hf_policy_and_its_chat_template(tmp_path):
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
    from agent_memory.models import build_tiny_lm

    def hf(path, *more):
        return [
            *GROWING,
            "policy=hf",
            f"policy.params.path={path}",
            "policy.params.max_new_tokens=8",
            *more,
        ]

    good = build_tiny_lm(tmp_path / "good", ["next", "red"])
    report = _check(*hf(good, "policy.params.incremental=true"))
    assert report.policy.renderer.incremental
    # A memory that rewrites the prompt is split into segments, not refused.
    _check(*hf(good, "policy.params.incremental=true"), "memory=notes")
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "but policy=hf renders every prompt whole: pass policy.params.incremental=true, or "
            "rollout.layout=step"
        ),
    ):
        _check(*hf(good))
    rewriting = build_tiny_lm(tmp_path / "bad", ["next", "red"], chat_template=REWRITING_TEMPLATE)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "rollout.layout=episode needs a chat template that appends a turn, but the chat "
            "template of policy=hf's tokenizer renders the earlier turns differently once a turn "
            "is added (e.g. it drops past reasoning): "
        ),
    ):
        _check(*hf(rewriting, "policy.params.incremental=true"))
    plain = build_tiny_lm(tmp_path / "plain", ["next", "red"], chat_template=None)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "the chat template of policy=hf's tokenizer is missing (the transcript formatter's "
            "chat messages need one): use a model whose template keeps earlier turns"
        ),
    ):
        _check(*hf(plain, "policy.params.incremental=true"))
    # Where memory rewrites the prompt a break only starts a segment: text prompts need no
    # chat template, and a whole render no incremental one.
    _check(*hf(plain), "memory=notes", "env.formatter=simple")
    _check(*hf(rewriting), "memory=notes")
