"""Both engines produce the same trajectories whatever order the answers arrive in.

A real mock OpenAI-compatible server on loopback answers from a hash of (prompt, request seed);
the openai client derives each request's seed from (policy seed, traj_uid, step) (see
:func:`~agent_memory.policies.base.episode_seed`), so an answer depends on its episode and step
only. The server's heavy-tailed random latency makes requests finish out of order, and the
asynchronous engine sends them in a different order from the lockstep one (which the test
checks, so that it cannot pass by both engines happening to run alike). Several workers with
several envs each, more episodes than envs (freed envs take waiting episodes), episodes of
different lengths.
"""

from __future__ import annotations

import hashlib
import threading

import pytest

from agent_memory.config import PolicyConfig
from agent_memory.rollout.advantages import compute_advantages
from agent_memory.rollout.async_collector import make_collector
from agent_memory.rollout.outputs import step_rows
from agent_memory.serving import HashBackend, LogNormalLatency, MockOpenAIServer
from tests.rollout.conftest import ENGINE, make_job

pytestmark = pytest.mark.usefixtures("ray_session")

MOVES = ("left", "down", "right", "up")


class Answers:
    """A pure answer function of (prompt, seed) that also records the order it was asked in."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int | None]] = []
        self.lock = threading.Lock()

    def __call__(self, prompt: str, seed: int | None) -> str:
        with self.lock:
            if seed is not None:  # not the policy's seedless server check (one per copy)
                self.asked.append((prompt, seed))
        digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
        if digest[0] % 8 == 0:  # now and then an invalid action (the penalty path)
            return "<action>jump</action>"
        return f"<think>step</think><action>{MOVES[digest[1] % 4]}</action>"


@pytest.fixture
def server():
    answers = Answers()
    latency = LogNormalLatency(median_s=0.002, p99_s=0.05, seed=1)
    with MockOpenAIServer(
        HashBackend(answers), latency=latency, max_in_flight=16, max_lifetime_s=300
    ) as srv:
        yield srv, answers


def _run(mode: str, base_url: str) -> tuple[list[str], list[dict]]:
    ENGINE["mode"] = mode
    try:
        job = make_job(
            "agent_memory/FrozenLake-v0", groups=6, size=4, workers=2, envs=5, map_name="8x8"
        )
    finally:
        ENGINE["mode"] = "async"
    job.env.max_steps = 12
    job.env.parser.invalid_penalty = -0.1  # returns differ within groups: advantages do too
    job.policy = PolicyConfig(
        name="openai",
        params={"base_url": base_url, "model": "hash", "seed": 1234, "concurrency": 16,
                "timeout": 30.0, "max_retries": 2},
    )  # fmt: skip
    collector = make_collector(job)
    try:
        trajs = collector.run()
    finally:
        collector.policy.close()  # the lockstep engine's client threads live in this process
    compute_advantages(trajs, job.algo)
    rows = step_rows(trajs)
    return [t.spec.traj_uid for t in trajs], rows


def test_async_and_lockstep_trajectories_are_identical(server):
    srv, answers = server
    lock_ids, lock_rows = _run("lockstep", srv.base_url)
    lock_asked, answers.asked = answers.asked, []
    async_ids, async_rows = _run("async", srv.base_url)
    async_asked = answers.asked

    # The runs really differ in the order the server was asked ...
    assert sorted(lock_asked) == sorted(async_asked)
    assert lock_asked != async_asked
    # ... and the work is not trivial: many steps, episodes of different lengths and outcomes.
    assert lock_ids == [f"g{g}-t{m}" for g in range(6) for m in range(4)]
    lengths = {r["traj_uid"]: r["step"] for r in lock_rows}
    assert len(set(lengths.values())) >= 3 and len(lock_rows) >= 60
    assert {r["is_action_valid"] for r in lock_rows} == {True, False}
    assert len({r["advantage"] for r in lock_rows}) >= 3

    # Same episodes in the same order, and the same rows, every column: prompts, responses,
    # rewards, advantages, per-request seeds, token ids.
    assert async_ids == lock_ids
    assert len(async_rows) == len(lock_rows)
    for a, b in zip(async_rows, lock_rows, strict=True):
        assert a == b, f"{a['traj_uid']} step {a['step']}: async {a} != lockstep {b}"
