"""The env bank apart from the Ray actor: the reference loop, the adapters and the trainer drive
envs through ``agent_memory.rollout.bank`` without importing Ray or the actor's module; the actor
holds a bank."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_memory.config import EnvConfig, JobConfig
from agent_memory.rollout.bank import EnvBank
from agent_memory.rollout.messages import EpisodeAssignment
from agent_memory.rollout.worker.worker import RolloutWorker
from tests.test_registry import package_imports

REPO = Path(__file__).resolve().parents[2]
ACTOR = "agent_memory.rollout.worker.worker"
#: The modules that drive envs in their caller's process.
IN_PROCESS = (
    "agent_memory.rollout.bank",
    "agent_memory.rollout.reference",
    "agent_memory.compat.trl",
    "agent_memory.compat.verl_env",
    "agent_memory.train.model",
)


def _job() -> JobConfig:
    return JobConfig(env=EnvConfig(id="agent_memory/Recall-v0", max_steps=3))


def test_the_in_process_callers_do_not_import_the_actor_module():
    graph = package_imports(REPO)
    importers = {m: graph[m][ACTOR] for m in IN_PROCESS if ACTOR in graph[m]}
    assert importers == {}, f"import {ACTOR} (module: line): {importers}"


def test_driving_envs_in_process_imports_neither_ray_nor_the_actor_module():
    """Each in-process caller, used for real in a fresh interpreter: the bank, the reference loop
    (its policy built from the job, as ``play`` does by default), the verl-agent env manager,
    the TRL episode runner and the trainer's env texts."""
    code = textwrap.dedent(
        """
        import sys

        from agent_memory.config import EnvConfig, JobConfig, PolicyConfig
        from agent_memory.rollout.bank import EnvBank
        from agent_memory.rollout.messages import EpisodeAssignment

        env = EnvConfig(id="agent_memory/Recall-v0", max_steps=3)
        job = JobConfig(env=env, policy=PolicyConfig("scripted"))
        bank = EnvBank(job, 2)
        bank.reset_envs([EpisodeAssignment(1, "t", "g", 0)])
        assert not bank.step({1: "<action>next</action>"})[0].error
        bank.close()

        from agent_memory.rollout.reference import play
        from agent_memory.rollout.types import EpisodeSpec

        (traj,) = play(job, [EpisodeSpec("g", "t", 0, 0, 0)])
        assert traj.steps

        from agent_memory.compat.verl_env import MemoryEnvironmentManager

        envs = MemoryEnvironmentManager(job, env_num=1)
        envs.reset(None)
        envs.close()

        from agent_memory.compat.trl import EpisodeRunner
        from agent_memory.policies import make_policy

        runner = EpisodeRunner(job, max_turns=2)
        (traj,) = runner.run(["seed=1"], make_policy("scripted", parser=job.env.parser.build()))
        runner.close()
        assert traj.steps

        from agent_memory.train.model import env_texts

        assert env_texts(job, 1, 0)
        print(sorted(m for m in sys.modules if m.split(".")[0] == "ray" or m == sys.argv[1]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code, ACTOR], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1] == "[]", f"imported: {out.stdout.splitlines()[-1]}"


def test_stepping_an_env_without_an_episode_names_it_and_what_to_do():
    bank = EnvBank(_job(), 2)
    try:
        with pytest.raises(
            ValueError,
            match=re.escape(
                "env bank: env(s) [1] have no running episode: step only envs that reset_envs "
                "started and whose episode has not ended (StepResult.done)"
            ),
        ):
            bank.step({1: "<action>next</action>"})
        bank.reset_envs([EpisodeAssignment(1, "t", "g", 0)])
        (res,) = bank.step({1: "bad words"})
        assert res.error is None and not res.is_action_valid
        bank.reset_envs([], park=[1])  # parked: nothing to play until its next episode
        with pytest.raises(ValueError, match=re.escape("env(s) [1] have no running episode")):
            bank.step({1: "<action>next</action>"})
    finally:
        bank.close()


def test_a_worker_whose_bank_cannot_be_built_reports_it_and_closes():
    job = _job()
    job.env.id = "agent_memory/NoSuchEnv-v0"
    worker = RolloutWorker(3, job, 2)  # never raises: status() reports the error
    assert worker.bank is None
    assert worker.init_error is not None and "NoSuchEnv" in worker.init_error

    async def play() -> None:
        async for _ in worker.run([]):
            pass

    with pytest.raises(RuntimeError, match=re.escape("worker 3 could not start:\n")):
        asyncio.run(play())
    worker.close()
