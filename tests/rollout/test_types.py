"""Trajectory flags: an episode both terminated and truncated on its last step counts once."""

from __future__ import annotations

import pytest

from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory


def _step(terminated: bool, truncated: bool) -> StepRecord:
    return StepRecord(
        step=1,
        prompt="p",
        response="r",
        parsed_action="a",
        valid=True,
        invalid_reason=None,
        reward=0.0,
        terminated=terminated,
        truncated=truncated,
        context_tokens=1,
        context_chars=1,
        history_steps=0,
        state_key=None,
    )


@pytest.mark.parametrize(
    ("last", "expected"),
    [
        ((True, True), (True, False)),  # the time limit struck on the final step: terminated
        ((True, False), (True, False)),
        ((False, True), (False, True)),
        ((False, False), (False, False)),
    ],
)
def test_terminated_wins_over_truncated(last, expected):
    spec = EpisodeSpec("g", "t", 0, 0, seed=0)
    traj = Trajectory(spec, steps=[_step(False, False), _step(*last)])
    assert (traj.terminated, traj.truncated) == expected
    assert Trajectory(spec).terminated is False and Trajectory(spec).truncated is False
