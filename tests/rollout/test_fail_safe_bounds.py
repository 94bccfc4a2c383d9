"""Faults with a bounded blast radius, through real rollouts on Ray workers.

A sub-env whose step returns a value of the wrong type or shape ends only its own episode: the
others stepped in the same vector step go on (``tests/wrappers/test_errors_step_values.py`` checks
the wrapper alone). A step that holds the GIL is in ``test_fail_safe.py``'s timeout test.
"""

from __future__ import annotations

import json

import pytest

from agent_memory.rollout import run_rollout
from tests.rollout.test_fail_safe import faulty_job

pytestmark = pytest.mark.usefixtures("ray_session", "engine")


@pytest.mark.parametrize(
    ("fault", "vectorization", "shown"),
    [
        ("reward_shape", "sync", "reward=array([0., 0., 0.]) (numpy.ndarray of shape (3,))"),
        ("terminated_array", "async", "terminated=array([1, 1]) (numpy.ndarray of shape (2,))"),
        ("terminated_text", "sync", "terminated='no' (str)"),
    ],
)
def test_bad_step_values_end_only_their_episodes(tmp_path, fault, vectorization, shown):
    # One worker, six envs: the 2 bad episodes (group 1) and 4 healthy ones step together.
    job = faulty_job(fault, bad_seed=1, groups=3, size=2, workers=1, envs=6)
    job.rollout.vectorization = vectorization
    summary = run_rollout(job, tmp_path)
    assert summary["status"] == "ok" and summary["worker_restarts"] == 0
    errors = {e["traj_uid"]: e for e in summary["episode_errors"]}
    assert sorted(errors) == ["g1-t0", "g1-t1"]
    for e in errors.values():
        assert e["error"].startswith(f"TypeError: env 'Faulty-v0' step returned {shown}: expected")
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    healthy = [r for r in rows if r["error"] is None]
    assert {r["traj_uid"] for r in healthy} == {"g0-t0", "g0-t1", "g2-t0", "g2-t1"}
    assert len(healthy) == 4 * 5 and all(r["won"] for r in healthy)  # complete, each once
