"""The engine (both modes) produces the reference loop's trajectories whatever order the answers
arrive in.

A real mock OpenAI-compatible server on loopback answers from a hash of (prompt, request seed);
the openai client derives each request's seed from (policy seed, traj_uid, step) (see
:func:`~agent_memory.policies.base.episode_seed`), so an answer depends on its episode and step
only. The server's heavy-tailed random latency makes requests finish out of order, and the
engine sends them in a different order from the in-process reference loop
(:func:`~agent_memory.rollout.reference.play`; the test checks it, so that it cannot pass by both
happening to run alike). Several workers with
several envs each, more episodes than envs (freed envs take waiting episodes), episodes of
different lengths.
"""

from __future__ import annotations

import hashlib
import threading

import pytest
from mock_server import HashBackend, LogNormalLatency, MockOpenAIServer

from agent_memory.config import PolicyConfig
from agent_memory.rollout.driver.advantages import compute_advantages
from agent_memory.rollout.driver.collector import Collector, build_policy, episode_specs
from agent_memory.rollout.driver.outputs import step_rows
from agent_memory.rollout.reference import play
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


def _job(base_url: str, mode: str = "async"):
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
        params={
            "base_url": base_url,
            "model": "hash",
            "seed": 1234,
            "concurrency": 16,
            "timeout": 30.0,
            "max_retries": 2,
        },
    )
    return job


def _rows(job, trajs) -> tuple[list[str], list[dict]]:
    compute_advantages(trajs, job.algo)
    return [t.spec.traj_uid for t in trajs], step_rows(trajs)


def _engine(mode: str, base_url: str) -> tuple[list[str], list[dict]]:
    job = _job(base_url, mode)
    return _rows(job, Collector(job).run())


def _reference(base_url: str) -> tuple[list[str], list[dict]]:
    job = _job(base_url)
    policy = build_policy(job)
    try:
        trajs = play(job, episode_specs(6, 4, job.rollout.seed), policy)
    finally:
        policy.close()  # its client threads live in this process
    return _rows(job, trajs)


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_the_engine_and_the_reference_loop_give_identical_trajectories(server, mode):
    srv, answers = server
    ref_ids, ref_rows = _reference(srv.base_url)
    ref_asked, answers.asked = answers.asked, []
    ids, rows = _engine(mode, srv.base_url)
    asked = answers.asked

    # The runs really differ in the order the server was asked ...
    assert sorted(ref_asked) == sorted(asked)
    assert ref_asked != asked
    # ... and the work is not trivial: many steps, episodes of different lengths and outcomes.
    assert ref_ids == [f"g{g}-t{m}" for g in range(6) for m in range(4)]
    lengths = {r["traj_uid"]: r["step"] for r in ref_rows}
    assert len(set(lengths.values())) >= 3 and len(ref_rows) >= 60
    assert {r["is_action_valid"] for r in ref_rows} == {True, False}
    assert len({r["advantage"] for r in ref_rows}) >= 3

    # Same episodes in the same order, and the same rows, every column: prompts, responses,
    # rewards, advantages, per-request seeds, token ids.
    assert ids == ref_ids
    assert len(rows) == len(ref_rows)
    for a, b in zip(rows, ref_rows, strict=True):
        assert a == b, f"{a['traj_uid']} step {a['step']}: {mode} {a} != reference {b}"
