"""The driver on real Ray workers: groups, no generation for finished envs, failures."""

from __future__ import annotations

import json
import os
import signal

import pytest

from agent_memory.policies.simple import ScriptedPolicy
from agent_memory.rollout import run_rollout
from agent_memory.rollout.driver.collector import Collector
from tests.rollout.conftest import make_job

pytestmark = pytest.mark.usefixtures("ray_session", "engine")


def test_group_members_start_from_the_same_state():
    job = make_job("agent_memory/Sokoban-v0", groups=3, size=3, policy="random")
    trajs = Collector(job).run()
    assert len(trajs) == 9
    first = {}
    for t in trajs:
        first.setdefault(t.spec.group_uid, set()).add(t.steps[0].prompt)
    assert all(len(prompts) == 1 for prompts in first.values())  # same within a group
    assert len({next(iter(p)) for p in first.values()}) == 3  # different across groups


@pytest.mark.both_engines
def test_no_generation_for_finished_envs_and_scripted_success():
    policy = ScriptedPolicy()
    job = make_job("agent_memory/Recall-v0", groups=3, size=2, workers=2, envs=2, num_distractors=2)
    collector = Collector(job, policy=policy)
    trajs = collector.run()
    steps = sum(len(t.steps) for t in trajs)
    # One request per real step: none for an env whose episode ended.
    assert collector.stats.policy_requests == steps == collector.stats.env_steps
    assert 1 <= collector.stats.reports <= len(trajs)  # each message brings at least one
    assert all(t.won and t.terminated and not t.truncated for t in trajs)
    assert [s.step for s in trajs[0].steps] == list(range(1, len(trajs[0].steps) + 1))


def test_truncation_is_kept_apart_from_termination():
    job = make_job("agent_memory/Sokoban-v0", policy="random", groups=2, size=2)
    job.env.max_steps = 2
    trajs = Collector(job).run()
    for t in trajs:
        assert len(t.steps) <= 2
        assert t.terminated != t.truncated  # exactly one way to end
        assert not any(s.terminated or s.truncated for s in t.steps[:-1])


@pytest.mark.both_engines
def test_an_env_exception_ends_only_its_episode():
    job = make_job("tests.rollout.flaky:Flaky-v0", groups=4, size=1, workers=1, envs=4)
    job.env.parser.tag = None  # Flaky takes bare actions
    job.policy.name = "random"
    trajs = Collector(job).run()
    crashed = [t for t in trajs if t.error]
    fine = [t for t in trajs if not t.error]
    assert [t.spec.seed % 2 for t in crashed] == [1, 1]  # odd seeds crash at step 3
    assert all("simulator crashed at step 3" in t.error and len(t.steps) == 3 for t in crashed)
    assert all(t.steps[-1].truncated for t in crashed)
    assert all(t.won and len(t.steps) == 5 for t in fine)


@pytest.mark.both_engines
def test_a_killed_worker_is_restarted_and_its_episodes_rerun(tmp_path):
    # Long episodes (32 steps): group 3 starts when the first episodes end, and its worker is
    # killed as soon as it runs one of group 3's, far from that episode's end in either engine
    # (the async engine queues an episode ahead only while more wait than there are slots: here
    # g0-t1 and g1-t1; with 3 groups, g2 ran from the start and the kill could come after its
    # worker had reported everything it ran: nothing re-ran).
    job = make_job(
        "agent_memory/Recall-v0", groups=4, size=2, workers=2, envs=2, num_distractors=30
    )
    killed = []

    def kill_worker_0(collector: Collector) -> None:
        book = collector.book
        late = [s[0] for s in book.running if book.running[s].spec.group_uid == "g3"]
        if not killed and late:  # the worker running a group-3 episode
            pid = collector.worker_pid(late[0])
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    summary = run_rollout(job, tmp_path, on_step=kill_worker_0)
    assert killed
    assert summary["episodes"] == 8 and summary["success_rate"] == 1.0
    assert summary["worker_restarts"] >= 1 and summary["episodes_rerun"] >= 1
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    by_traj: dict[str, list[int]] = {}
    for r in rows:
        by_traj.setdefault(r["traj_uid"], []).append(r["step"])
    assert sorted(by_traj) == sorted(f"g{g}-t{m}" for g in range(4) for m in range(2))
    for steps in by_traj.values():  # each episode exactly once, complete from step 1
        assert steps == list(range(1, len(steps) + 1))
    assert any(r["attempts"] == 2 for r in rows)


def test_outputs_and_summary(tmp_path):
    job = make_job("agent_memory/Sokoban-v0", policy="random", groups=2, size=3, algo="gigpo")
    summary = run_rollout(job, tmp_path)
    assert set(summary["outputs"]) == {"jsonl", "parquet", "summary", "errors"}
    import pyarrow.parquet as pq

    table = pq.read_table(tmp_path / "trajectories.parquet")
    required = {
        "group_uid",
        "traj_uid",
        "step",
        "prompt",
        "response",
        "parsed_action",
        "is_action_valid",
        "reward",
        "terminated",
        "truncated",
        "context_tokens",
        "advantage",
        "return",
    }
    assert required <= set(table.column_names)
    assert table.num_rows == summary["env_steps"]
    saved = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "episodes",
        "success_rate",
        "mean_return",
        "valid_action_ratio",
        "mean_prompt_tokens",
        "max_prompt_tokens",
        "env_steps_per_second",
        "wall_time_seconds",
        "worker_restarts",
    ):
        assert key in saved
    assert saved["max_prompt_tokens"] >= saved["mean_prompt_tokens"] > 0


def test_too_many_cpus_per_worker_is_a_clear_error():
    job = make_job("agent_memory/Recall-v0", workers=2)
    job.rollout.num_cpus_per_worker = 64.0
    with pytest.raises(
        ValueError,
        match=r"needs 128 CPUs but the Ray cluster has \d+: lower rollout\.num_cpus_per_worker",
    ):
        Collector(job).run()


def test_a_worker_that_cannot_restart_leaves_its_episodes_to_the_others():
    # As above: the kill lands in a fresh 32-step group-3 episode, far from its end.
    job = make_job(
        "agent_memory/Recall-v0", groups=4, size=2, workers=2, envs=2, num_distractors=30
    )
    job.rollout.max_restarts = 0
    killed: list[int] = []

    def kill_late_worker(collector: Collector) -> None:
        book = collector.book
        late = [s[0] for s in book.running if book.running[s].spec.group_uid == "g3"]
        if not killed and late:
            killed.append(late[0])
            os.kill(collector.worker_pid(late[0]), signal.SIGKILL)

    collector = Collector(job, on_step=kill_late_worker)
    trajs = collector.run()
    assert killed and collector.stats.workers_lost == 1
    assert len(trajs) == 8 and all(t.won for t in trajs)
    rerun = [t for t in trajs if t.attempts == 2]
    assert rerun and all(t.worker == 1 - killed[0] for t in rerun)


def test_async_sub_envs_with_the_scripted_oracle():
    job = make_job("agent_memory/Recall-v0", groups=2, size=2, workers=1, envs=4, num_distractors=2)
    job.rollout.vectorization = "async"
    trajs = Collector(job).run()
    assert len(trajs) == 4 and all(t.won and len(t.steps) == 4 for t in trajs)


def test_workers_stay_up_across_collect_calls():
    from agent_memory.rollout.driver.collector import episode_specs

    job = make_job("agent_memory/Recall-v0", groups=2, size=2, workers=2, envs=2, num_distractors=1)
    collector = Collector(job)
    collector.start()
    try:
        pids = [collector.worker_pid(w) for w in range(2)]
        first = collector.collect(episode_specs(2, 2, seed=0))
        second = collector.collect(episode_specs(3, 2, seed=100))  # more episodes than slots
        assert [collector.worker_pid(w) for w in range(2)] == pids  # the same processes
    finally:
        collector.close()
    assert [t.spec.seed for t in first] == [0, 0, 1, 1]
    assert [t.spec.seed for t in second] == [100, 100, 101, 101, 102, 102]
    assert all(t.won and len(t.steps) == 3 for t in first + second)


@pytest.mark.both_engines
def test_a_version_update_between_collects_reaches_every_row(engine):
    from agent_memory.rollout.driver.collector import episode_specs

    job = make_job("agent_memory/Recall-v0", groups=2, size=2, workers=2, envs=2, num_distractors=1)
    collector = Collector(job)
    collector.start()
    try:
        first = collector.collect(episode_specs(2, 2, seed=0))
        if engine == "async":  # the scripted policy runs in the workers: they get the version
            collector.update_policy(None, 3)
        else:  # the lockstep engine calls the driver's policy itself
            collector.policy.version = 3
        second = collector.collect(episode_specs(2, 2, seed=0))
    finally:
        collector.close()
    assert {s.generation.policy_version for t in first for s in t.steps} == {0}
    assert {s.generation.policy_version for t in second for s in t.steps} == {3}
