"""OpenEnv both ways, against real ``openenv-core`` server and client processes on loopback ports.

Serve: ``python -m agent_memory.openenv_server`` plays a bundled env with a memory strategy to
OpenEnv's own client (``GenericEnvClient``) and passes ``openenv validate``. Consume: ``env=openenv``
(:class:`~agent_memory.envs.openenv_client.OpenEnvTextEnv`) plays a server's episode as the
in-process env plays it, runs ``scripts/rollout.py``, and turns a server that ignores seeds, fails
or stalls into a warning or a failed episode, never a hang.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip("openenv", reason="the 'openenv' extra is not installed")

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.config import EnvConfig, JobConfig, ParserConfig
from agent_memory.envs.openenv_client import (
    OpenEnvError,
    OpenEnvTextEnv,
    SeedIgnoredWarning,
)
from agent_memory.envs.openenv_process import free_port
from agent_memory.openenv_server import compose_job
from agent_memory.rollout.bank import EnvBank
from agent_memory.rollout.messages import EpisodeAssignment

REPO = Path(__file__).resolve().parents[2]
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
SERVED = ["env=recall", "memory=window", "env.history_length=2"]
# The env alone (no history, the whole response to the env): a consumer wraps it in its memory.
BARE = ["env=recall", "memory=none", "env.parser.tag=null"]


def _serve(argv: list[str]) -> Iterator[str]:
    """Start ``python argv... PORT`` (or ``--port PORT``), yield its URL once healthy, stop it."""
    port = free_port()
    args = [a.replace("{port}", str(port)) for a in argv]
    proc = subprocess.Popen(
        [sys.executable, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        },
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()[0].decode()[-3000:]
            try:
                with _DIRECT.open(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the OpenEnv server did not become healthy"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    """Recall with a window of 2 steps, served."""
    yield from _serve(["-m", "agent_memory.openenv_server", "--port", "{port}", *SERVED])


@pytest.fixture(scope="module")
def bare() -> Iterator[str]:
    """Recall served without history, the whole message to the env."""
    yield from _serve(["-m", "agent_memory.openenv_server", "--port", "{port}", *BARE])


@pytest.fixture(scope="module")
def unruly() -> Iterator[str]:
    yield from _serve(["-m", "tests.envs.openenv_unruly", "{port}"])


def _answers(env: gym.Env) -> list[str]:
    """Recall's expert responses for the episode ``env`` plays, from its start, with one
    invalid response after the first."""
    plan = []
    probe = env.unwrapped
    while True:
        action = probe.oracle_action()
        plan.append(f"<action>{action}</action>")
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return [plan[0], "<action>jump</action>", *plan[1:]]


# ---------------------------------------------------------------------- serve


def test_a_served_env_plays_to_openenvs_own_client_as_a_rollout_sees_it(served):
    """Reset with a seed twice gives the same prompt; steps reach done; each prompt and reward is
    the in-process bank's (the same memory), each reward the bundled env's own."""
    from openenv.core import GenericEnvClient

    seed = 11
    raw = gym.make("agent_memory/Recall-v0")
    raw.reset(seed=seed)
    answers = _answers(raw)
    raw.reset(seed=seed)
    bank = EnvBank(compose_job(SERVED), 1)
    (start,) = bank.reset_envs([EpisodeAssignment(0, "t", "g", seed)])
    assert start.view is not None
    with GenericEnvClient(base_url=served).sync() as client:
        first = client.reset(seed=seed)
        again = client.reset(seed=seed)
        other = client.reset(seed=seed + 1)
        assert first.observation == again.observation
        assert other.observation["observation"] != first.observation["observation"]
        client.reset(seed=seed)
        assert first.observation["prompt"] == start.view.prompt
        assert first.observation["seed"] == seed and first.done is False
        for step, answer in enumerate(answers, 1):
            result = client.step({"message": answer})
            (mine,) = bank.step({0: answer})
            parsed = re.fullmatch(r"<action>(.*)</action>", answer).group(1)
            _, reward, terminated, truncated, _ = raw.step(parsed)
            assert result.observation["prompt"] == mine.next.prompt, step
            assert result.reward == mine.reward == reward, step
            assert result.observation["is_action_valid"] is mine.is_action_valid
            assert result.done is (terminated or truncated) is mine.done, step
            assert client.state().get("step_count") == step
        assert result.done and result.reward == 1.0 and result.observation["won"] is True
        assert mine.next.history_steps == 2  # the window: what the memory strategy shows
    bank.close()


def test_a_served_env_passes_openenvs_validation(served):
    """``openenv validate --url`` (its runtime conformance check: OpenAPI version, health,
    metadata, schemas, the simulation mode's endpoints), called as the CLI calls it."""
    from openenv.cli._validation import validate_running_environment

    report = validate_running_environment(served, timeout_s=30)
    assert report["passed"] is True, json.dumps(report, indent=1)[-3000:]
    assert report["summary"]["failed_criteria"] == [] and report["mode"] == "simulation"


# ---------------------------------------------------------------------- consume


def _bank(env: EnvConfig) -> EnvBank:
    return EnvBank(JobConfig(env=env), 1, meta_fields=("admissible_actions",))


def test_our_consumer_plays_our_server_as_the_in_process_env(bare):
    """The whole episode, invalid response included: prompts with history (the consumer's
    window), rewards, endings, validity and the admissible actions are the in-process env's."""
    seed = 5
    raw = gym.make("agent_memory/Recall-v0")
    raw.reset(seed=seed)
    answers = _answers(raw)
    local = _bank(EnvConfig(id="agent_memory/Recall-v0", history_length=3))
    remote = _bank(
        EnvConfig(
            id="agent_memory/OpenEnv-v0",
            kwargs={"base_url": bare, "observation_field": "observation"},
            history_length=3,
            parser=ParserConfig(),
        )
    )
    episode = [EpisodeAssignment(0, "t", "g", seed)]
    (a,), (b,) = local.reset_envs(episode), remote.reset_envs(episode)
    assert a.error is None and b.error is None
    assert b.view.prompt == a.view.prompt and b.view.meta == a.view.meta
    for answer in answers:
        (x,), (y,) = local.step({0: answer}), remote.step({0: answer})
        assert y.error is None, y.error
        assert (y.next.prompt, y.reward, y.terminated, y.truncated) == (
            x.next.prompt,
            x.reward,
            x.terminated,
            x.truncated,
        )
        assert (y.is_action_valid, y.invalid_reason, y.won, y.state_key) == (
            x.is_action_valid,
            x.invalid_reason,
            x.won,
            x.state_key,
        )
        assert y.next.meta == x.next.meta
    assert x.done and x.won
    local.close()
    remote.close()


def test_the_rollout_script_plays_an_openenv_server(bare, tmp_path):
    """``scripts/rollout.py env=openenv env.kwargs.base_url=...`` with a memory strategy writes
    rows whose prompts carry the consumer's history of the server's observations."""
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/rollout.py",
            "env=openenv",
            f"env.kwargs.base_url={bare}",
            "env.kwargs.observation_field=observation",
            "memory=window",
            "env.history_length=2",
            "policy=random",
            "rollout.num_groups=1",
            "rollout.group_size=2",
            "rollout.num_workers=1",
            "rollout.envs_per_worker=2",
            "rollout.num_cpus_per_worker=0.5",
            "rollout.progress=false",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len({r["traj_uid"] for r in rows}) == 2
    assert rows[0]["prompt"].count("Remember this:") == 1  # the server's first observation
    later = [r for r in rows if r["step"] >= 4]  # steps count from 1: the cue was step 1
    assert later and all("Remember this:" not in r["prompt"] for r in later)  # out of the window
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["episodes"] == 2


def test_a_command_starts_the_server_and_close_stops_it():
    argv = ["python", "-m", "agent_memory.openenv_server", "--port", "{port}", *BARE]
    env = gym.make(
        "agent_memory/OpenEnv-v0",
        command=argv,
        observation_field="observation",
        max_episode_steps=3,
    )
    inner = env.unwrapped
    assert isinstance(inner, OpenEnvTextEnv)
    server = inner._server
    assert server is not None and server.process.poll() is None
    obs, info = env.reset(seed=2)
    assert obs.startswith("Remember this:") and info["admissible_actions"] == ["next"]
    assert info["seed_honoured"] is True
    env.close()
    assert server.process.poll() is not None  # stopped with the last env that used it


def test_a_server_that_ignores_seeds_is_warned_about_and_flagged(unruly):
    env = gym.make("agent_memory/OpenEnv-v0", base_url=unruly, observation_field="text")
    with pytest.warns(
        SeedIgnoredWarning,
        match=re.escape(
            f"OpenEnv server {unruly} ignores seed: two resets with seed=3 gave different "
            'observations, so its episodes do not repeat (info["seed_honoured"] is False)'
        ),
    ):
        _, info = env.reset(seed=3)
    assert info["seed_honoured"] is False
    obs, reward, terminated, truncated, info = env.step("hello")
    assert (obs, reward, terminated, truncated) == ("hello", 1.0, False, False)
    assert info == {"seed_honoured": False}
    assert env.step("stop")[2] is True
    env.close()


def test_a_stalled_or_failing_server_ends_the_episode_never_hangs(unruly):
    """A step past ``message_timeout_s`` or a server error raises OpenEnvError naming the
    setting; the env resets afresh afterwards (a new session)."""
    env = gym.make(
        "agent_memory/OpenEnv-v0", base_url=unruly, message_timeout_s=1.0, check_seed=False
    )
    env.reset(seed=1)
    with pytest.raises(
        OpenEnvError,
        match=re.escape(
            f"OpenEnv server {unruly}: step failed (TimeoutError: no answer within 1.0 s); the "
            "episode ends as failed (limits: env.kwargs.connect_timeout_s, "
            "env.kwargs.message_timeout_s)"
        ),
    ):
        env.step("slow")
    obs, _ = env.reset(seed=1)
    assert json.loads(obs)["text"].startswith("draw ")  # null observation_field: the JSON
    with pytest.raises(OpenEnvError, match=re.escape("step failed (RuntimeError: Server error:")):
        env.step("boom")
    env.reset()
    assert env.step("fine")[0] == '{"text": "fine"}'
    env.close()


def test_a_failed_step_is_a_failed_episode_in_the_bank(unruly):
    bank = _bank(
        EnvConfig(
            id="agent_memory/OpenEnv-v0",
            kwargs={"base_url": unruly, "observation_field": "text", "check_seed": False},
            parser=ParserConfig(tag=None),
        )
    )
    (start,) = bank.reset_envs([EpisodeAssignment(0, "t", "g", 0)])
    assert start.error is None
    (step,) = bank.step({0: "boom"})
    assert step.done and step.truncated and "OpenEnvError" in step.error
    (start,) = bank.reset_envs([EpisodeAssignment(0, "u", "g", 1)])
    assert start.error is None and start.view.observation.startswith("draw ")
    bank.close()


def test_no_server_is_an_error_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    env = OpenEnvTextEnv(base_url=url, connect_timeout_s=2.0)
    with pytest.raises(OpenEnvError, match=re.escape(f"OpenEnv server {url}: connect failed")):
        env.reset(seed=0)
    env.close()


def test_an_observation_without_the_field_names_the_fields_it_has(unruly):
    env = OpenEnvTextEnv(base_url=unruly, observation_field="prompt", check_seed=False)
    with pytest.raises(
        OpenEnvError,
        match=re.escape(
            "the server's observation has no field 'prompt' (it has: text): set "
            "env.kwargs.observation_field to one of them, or to null for the whole observation "
            "as JSON"
        ),
    ):
        env.reset(seed=0)
    env.close()


def test_base_url_or_command_exactly_one():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "env.kwargs: give base_url (a running OpenEnv server) or command (argv that starts "
            "one), none was given"
        ),
    ):
        OpenEnvTextEnv()


def test_a_command_that_exits_names_itself_and_its_output():
    argv = ["python", "-c", "print('no such env'); raise SystemExit(2)"]
    with pytest.raises(
        RuntimeError,
        match=re.escape("the OpenEnv server command exited with status 2 before it was healthy: ")
        + r".* -c .*\nno such env\n",
    ):
        OpenEnvTextEnv(command=argv)


@pytest.mark.parametrize(
    ("overrides", "env_id", "kwargs"),
    [
        (["env=sokoban", "memory=window"], "agent_memory/Sokoban-v0", {}),
        (["env=track", "memory=full", "env.kwargs.steps=8"], "agent_memory/Track-v0", {"steps": 8}),
    ],
    ids=["sokoban", "track"],
)
def test_each_bundled_env_serves_its_seeded_episode(overrides, env_id, kwargs):
    """The served env (in this process) repeats an episode for its seed, differs for another,
    and its rewards and ending are the bundled env's own for the expert's actions."""
    from agent_memory.openenv_server import MemoryEnvironment, TextAction

    served = MemoryEnvironment(compose_job(overrides))
    raw = gym.make(env_id, **kwargs)
    starts = [served.reset(seed=s).prompt for s in (4, 4, 5, 6)]
    assert starts[0] == starts[1] and len({starts[0], starts[2], starts[3]}) > 1
    served.reset(seed=4)
    raw.reset(seed=4)
    total = 0.0
    while True:
        action = raw.unwrapped.oracle_action()
        _, reward, terminated, truncated, _ = raw.step(action)
        obs = served.step(TextAction(message=f"<action>{action}</action>"))
        assert obs.is_action_valid and obs.reward == reward
        total += reward
        if terminated or truncated:
            break
        assert not obs.done
    assert obs.done and obs.won and obs.truncated is truncated and total > 0
    served.close()


def test_the_openenv_config_passes_preflight_without_building_the_env():
    """The check before Ray binds the kwargs (no connection: the server may start later)."""
    from hydra import compose, initialize_config_dir

    from agent_memory.config import load_job
    from agent_memory.rollout.driver.preflight import preflight

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: preflight must not connect
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        job = load_job(compose("config", ["env=openenv", f"env.kwargs.base_url={url}"]))
    report = preflight(job, probe=False)
    report.policy.close()
    assert report.env.env_class is OpenEnvTextEnv
    assert report.env.kwargs["base_url"] == url and report.env.kwargs["action_field"] == "message"


def test_a_memory_turn_is_served_as_a_prompt_the_next_message_answers():
    """With ``summarizer=policy`` the memory asks the model for its summary in a turn of its own:
    the observation says so (``memory_turn``), and the next message answers it (no env step)."""
    from agent_memory.openenv_server import MemoryEnvironment, TextAction

    overrides = [
        "env=recall",
        "memory=compaction",
        "memory.params.summarizer=policy",
        "memory.params.trigger_steps=2",
        "memory.params.keep_last=1",
    ]
    served = MemoryEnvironment(compose_job(overrides))
    served.reset(seed=1)
    for _ in range(4):
        obs = served.step(TextAction(message="<action>next</action>"))
        if obs.memory_turn:
            break
    assert obs.memory_turn and not obs.done and obs.reward == 0.0
    steps = served.state.step_count
    answered = served.step(TextAction(message="The hat is RED."))
    assert not answered.memory_turn and served.state.step_count == steps  # the env did not step
    assert "The hat is RED." in answered.prompt  # the summary the model wrote, in the prompt
    served.close()
