"""Tool calls as actions against a real vLLM (``tests/real_vllm.py``'s servers: ``default`` runs
the hermes tool parser, ``processed`` none).

A rollout with ``policy.params.tools=env`` writes exact rows: the response ids decode to the
response text, the prompt ids are the chat template's rendered WITH the tools the row records,
and the log-probs are a teacher-forced recomputation's. The tiny model writes no calls of its own,
so the calls (one, parallel, to an unknown tool, with malformed arguments or JSON) are forced
with a regex grammar sent past the policy's own refusal of grammars (a test's bypass: the
grammar changes the sampled distribution): vLLM's real answer (content null, structured
``tool_calls``) is read, checked against the decoded ids, and the wrappers' parser turns it
into the action or an invalid step whose reason names the fault.

Set ``AGENT_MEMORY_SKIP_VLLM=1`` to skip these where nothing can be installed (CI never does).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent_memory.parsing import ActionParser
from agent_memory.policies.openai_client import OpenAIPolicy
from agent_memory.tool_actions import act_tool, tool_action
from tests.real_vllm import MODEL, PYTESTMARK, TINY_ROLLOUT

pytestmark = PYTESTMARK
torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-4
ADMISSIBLE = ["up", "down"]
#: Text only: no tokenizer to load.
NO_TOKENS = {"return_tokens": False}
TOOLS = [act_tool(ADMISSIBLE)]


@pytest.fixture(scope="module")
def hf(qwen):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen, local_files_only=True)  # float32
    return model.eval(), AutoTokenizer.from_pretrained(qwen, local_files_only=True)


def _rollout(tmp_path: Path, base_url: str, *overrides: str) -> subprocess.CompletedProcess:
    args = [
        sys.executable,
        "scripts/rollout.py",
        "policy=openai",
        f"policy.params.base_url={base_url}",
        f"policy.params.model={MODEL}",
        "policy.params.seed=5",
        "policy.params.tools=env",
        *TINY_ROLLOUT,
        *overrides,
        f"hydra.run.dir={tmp_path}",
    ]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_a_rollout_with_env_tools_writes_exact_rows(vllm_servers, hf, qwen, tmp_path):
    # The default server: vLLM's hermes parser reads every answer first.
    from mock_server import teacher_forced_logprobs

    model, tok = hf
    proc = _rollout(
        tmp_path,
        vllm_servers["default"],
        "policy.params.max_tokens=8",
        f"policy.params.tokenizer={qwen}",
        "policy.params.temperature=1.0",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    stats = summary["policy_stats"]
    assert summary["status"] == "ok" and stats["failures"] == 0, stats
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) >= 2
    for r in rows:
        tools = json.loads(r["tools"])
        assert [t["function"]["name"] for t in tools] == ["act"]
        assert tools[0]["function"]["parameters"]["properties"]["action"]["enum"]
        assert r["response"] == tok.decode(r["response_ids"], skip_special_tokens=True)
        chat = [{"role": "user", "content": r["prompt"]}]
        rendered = tok.apply_chat_template(
            chat, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert r["prompt_ids"] == rendered and r["context_tokens"] == len(rendered)
        assert "<tools>" in tok.decode(r["prompt_ids"])
        forced = teacher_forced_logprobs(
            model, r["prompt_ids"], r["response_ids"], temperature=1.0, top_p=1.0, top_k=-1
        )
        diffs = [abs(a - b) for a, b in zip(forced, r["response_logprobs"], strict=True)]
        assert max(diffs) < TOL, (r["step"], diffs)
        # The tiny model writes no call: each step is invalid, and says why (never an error).
        assert r["is_action_valid"] is False and r["error"] is None
        assert r["invalid_reason"].startswith(("no tool call", "malformed", "unclosed", "unknown"))
    assert summary["valid_action_ratio"] == 0.0  # counted in the run's figures


def test_processed_log_probs_with_tools_are_the_sampled_distributions(vllm_servers, hf, qwen):
    # No tool parser on this server (tool_choice none): the tools are rendered all the same.
    from mock_server import teacher_forced_logprobs

    model, tok = hf
    sampling = {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}
    env_tools = [[act_tool(["up", "down"])], [act_tool(["left"])]]
    meta = [{"tools": t, "traj_uid": f"t{k}", "step": 1} for k, t in enumerate(env_tools)]
    with OpenAIPolicy(
        vllm_servers["processed"],
        MODEL,
        tokenizer=qwen,
        tools="env",
        tool_choice="none",
        max_tokens=8,
        seed=3,
        **sampling,
    ) as policy:
        gens = policy.generate(["Which way?", "Which way?"], meta)
        assert policy.stats.failures == 0 and policy.logprobs_kind == "processed"
    for g, tools in zip(gens, env_tools, strict=True):
        assert json.loads(g.sampling.tools) == tools and g.sampling.tool_choice == "none"
        assert g.text == tok.decode(g.response_ids, skip_special_tokens=True)
        assert g.prompt_ids == tok.apply_chat_template(
            [{"role": "user", "content": "Which way?"}],
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        forced = teacher_forced_logprobs(model, g.prompt_ids, g.response_ids, **sampling)
        diffs = [abs(a - b) for a, b in zip(forced, g.response_logprobs, strict=True)]
        assert max(diffs) < TOL, diffs


@pytest.fixture(scope="module")
def forcing(vllm_servers, qwen):
    """One policy per server offering :data:`TOOLS` (the processed server's with tool_choice
    none: it has no tool parser), built once: the tokenizer takes seconds to load."""
    policies = {
        server: OpenAIPolicy(
            vllm_servers[server],
            MODEL,
            tokenizer=qwen,
            tools=TOOLS,
            max_tokens=256,  # a grammar may spell a call in many short tokens
            temperature=1.0,
            seed=0,
            **({} if server == "default" else {"tool_choice": "none"}),
        )
        for server in ("default", "processed")
    }
    yield policies
    for policy in policies.values():
        policy.close()


def _forced_answer(policy: OpenAIPolicy, regex: str) -> Any:
    """The policy's generation when vLLM's decoding is forced to ``regex`` (bypassing the
    policy's refusal of grammars: a test's way to make the tiny model call a tool)."""
    policy.extra_body = {"structured_outputs": {"regex": regex}}
    try:
        (g,) = policy.generate(["Which way?"])
    finally:
        policy.extra_body = {}
    assert policy.last_stats.failures == 0 and not g.failed, g.error
    return g


def _call(name: str, arguments: str) -> str:
    return (
        "<tool_call>\\n"
        + re.escape(f'{{"name": "{name}", "arguments": {arguments}}}')
        + ("\\n</tool_call>")
    )


@pytest.mark.parametrize(
    ("regex", "action", "reason"),
    [
        (_call("act", '{"action": "down"}'), "down", None),
        (
            _call("act", '{"action": "down"}') + "\\n" + _call("act", '{"action": "up"}'),
            None,
            "2 tool calls in the response, expected 1 (the env takes no parallel calls",
        ),
        (_call("fly", '{"to": "moon"}'), None, "unknown tool 'fly' (known: 'act')"),
        (
            _call("act", '{"move": "up"}'),
            None,
            "malformed arguments of 'act' ({\"move\": \"up\"}): missing 'action'",
        ),
        (
            re.escape('<tool_call>{"name": act}</tool_call>'),
            None,
            "malformed JSON in <tool_call> (Expecting value)",
        ),
    ],
)
def test_vllms_tool_calls_become_the_action_or_a_named_invalid_step(
    forcing, hf, regex, action, reason
):
    _model, tok = hf
    g = _forced_answer(forcing["default"], regex)
    assert g.text == tok.decode(g.response_ids, skip_special_tokens=True)
    assert "<tool_call>" in g.text
    chat = [{"role": "user", "content": "Which way?"}]
    assert g.prompt_ids == tok.apply_chat_template(
        chat, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    parsed = tool_action(ActionParser(), g.text, ADMISSIBLE)
    assert parsed.action == action
    if reason is not None:
        assert parsed.reason.startswith(reason), parsed.reason
    if "2 tool calls" in (reason or ""):  # where the env takes parallel calls: both, in order
        both = tool_action(ActionParser(), g.text, ADMISSIBLE, parallel=True)
        assert both.valid and both.action == ["down", "up"]


def test_without_the_hermes_parser_the_text_alone_gives_the_call(forcing):
    # The processed server has no tool parser: the call is plain content, read the same way.
    g = _forced_answer(forcing["processed"], _call("act", '{"action": "up"}'))
    assert tool_action(ActionParser(), g.text, ADMISSIBLE).action == "up"


def test_a_server_without_a_tool_parser_refuses_auto_at_the_start_naming_the_fix(
    vllm_servers, qwen
):
    from agent_memory.policies.openai_client import ServerRefused

    with (
        OpenAIPolicy(vllm_servers["processed"], MODEL, tools=[act_tool()], **NO_TOKENS) as policy,
        pytest.raises(ServerRefused, match=re.escape("pass policy.params.tool_choice=none")),
    ):
        policy.check_server()


def _masked_teacher_forcing(
    model: Any, tok: Any, prompt_ids: list[int], response_ids: list[int], target: str
) -> list[float]:
    """Each response token's log-prob at temperature 1 under the model with vLLM's grammar mask
    for the literal ``target``: among the tokens whose text extends the text so far within
    ``target`` (after it, among the tokenizer's stop tokens) — what the raw log-probs of a
    forced answer are (vLLM masks the logits before it computes them)."""
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    stops = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + response_ids])).logits[0].double()
    out, done = [], ""
    for k, token in enumerate(response_ids):
        rest = target[len(done) :]
        allowed = (
            [i for i, t in enumerate(texts) if t and rest.startswith(t)] if rest else list(stops)
        )
        assert token in allowed, (k, token, texts[token], rest[:20])
        row = logits[len(prompt_ids) + k - 1]
        out.append(float(row[token] - torch.logsumexp(row[allowed], dim=0)))
        done += texts[token] if rest else ""
    return out


def test_a_memory_write_and_an_act_call_write_exact_rows_and_the_note(vllm_servers, hf, qwen):
    # policy=openai tools=env memory=notes write_with=tools: each answer forced to a memory_write
    # call then an act call (a test's bypass of the policy's refusal of grammars).
    from agent_memory.config import EnvConfig, JobConfig, MemoryConfig, PolicyConfig, RolloutConfig
    from agent_memory.rollout.driver.collector import build_policy, episode_specs
    from agent_memory.rollout.reference import play

    model, tok = hf
    write = '<tool_call>\n{"name": "memory_write", "arguments": {"text": "cue seen"}}\n</tool_call>'
    act = '<tool_call>\n{"name": "act", "arguments": {"action": "next"}}\n</tool_call>'
    job = JobConfig(
        env=EnvConfig(id="agent_memory/Recall-v0", kwargs={"num_distractors": 1}, max_steps=2),
        memory=MemoryConfig("notes", params={"write_with": "tools"}),
        policy=PolicyConfig(
            "openai",
            {
                "base_url": vllm_servers["default"],
                "model": MODEL,
                "tokenizer": qwen,
                "tools": "env",
                "max_tokens": 256,
                "temperature": 1.0,
                "seed": 0,
            },
        ),
        rollout=RolloutConfig(envs_per_worker=1),
    )
    policy = build_policy(job)
    policy.check_server()
    policy.extra_body = {"structured_outputs": {"regex": re.escape(f"{write}\n{act}")}}
    try:
        (traj,) = play(job, episode_specs(1, 1, seed=0), policy)
    finally:
        policy.close()
    assert traj.error is None and len(traj.steps) == 2, traj.error
    names = ["act", "memory_write", "memory_replace", "memory_delete"]
    for step in traj.steps:
        g = step.generation
        tools = json.loads(g.sampling.tools)
        assert [t["function"]["name"] for t in tools] == names  # as sent
        assert g.text == tok.decode(g.response_ids, skip_special_tokens=True) == f"{write}\n{act}"
        assert g.prompt_ids == tok.apply_chat_template(
            [{"role": "user", "content": step.prompt}],
            tools=tools,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        assert "as a call of act" in step.prompt and "<action> </action>" not in step.prompt
        # The action is the act call's; the memory call is no env action.
        assert step.valid and step.parsed_action == "next" and step.memory_flag is None
        # memory_mask: exactly the tokens whose text overlaps the memory_write call.
        ids = g.response_ids
        offsets = [len(tok.decode(ids[:k], skip_special_tokens=True)) for k in range(len(ids))]
        ends = [*offsets[1:], len(g.text)]
        want = [int(a < len(write) and b > a) for a, b in zip(offsets, ends, strict=True)]
        assert step.memory_mask == want and 0 < sum(want) < len(ids)
        forced = _masked_teacher_forcing(model, tok, g.prompt_ids, ids, g.text)
        diffs = [abs(a - b) for a, b in zip(forced, g.response_logprobs, strict=True)]
        assert max(diffs) < TOL, (step.step, diffs)
    first, second = traj.steps
    assert "Memory:\ncue seen" not in first.prompt
    assert "Memory:\ncue seen" in second.prompt  # the note the first answer's call wrote
