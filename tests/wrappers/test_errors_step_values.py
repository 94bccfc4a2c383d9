"""A sub-env whose step returns a value of the wrong type or shape ends only its own episode.

Gymnasium's vector step copies every sub-env's reward and flags into one array: a reward of shape
(3,) or ``terminated=np.array([1, 1])`` raised there, outside any sub-env's guard, ending every
episode of that step; ``terminated="no"`` was read as True. ``CatchErrors`` checks them inside
the sub-env (both vector-env kinds); ``tests/rollout/test_fail_safe_bounds.py`` runs the same
faults through a rollout.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from agent_memory.wrappers.errors import CatchErrors, step_value_error
from tests.rollout.faulty import BAD_VALUES, FaultyEnv

SEEDS = [0, 0, 1, 1, 2, 2]  # bad_seed=1: sub-envs 2 and 3 go wrong at step 2, 4 stay healthy
BAD = [2, 3]
EXPECTED = {
    "reward_shape": "step returned reward=array([0., 0., 0.]) (numpy.ndarray of shape (3,)): "
    "expected a real scalar (int, float, numpy number or 0-d array; NaN and inf allowed)",
    "terminated_array": "step returned terminated=array([1, 1]) (numpy.ndarray of shape (2,)): "
    "expected a bool (or numpy.bool_)",
    "terminated_text": "step returned terminated='no' (str): expected a bool (or numpy.bool_)",
    "info_list": "step returned info=[{'admissible_actions': ['go'], 'state_key': 's2', 'won': "
    "False}] (list): expected a dict",
}


def _faulty(fault: str):
    return lambda: CatchErrors(FaultyEnv(fault=fault, bad_seed=1, at_step=2))


def _vector(kind: str, fault: str):
    fns = [_faulty(fault) for _ in SEEDS]
    if kind == "sync":
        return SyncVectorEnv(fns)
    return AsyncVectorEnv(fns, shared_memory=False)


@pytest.mark.parametrize("fault", sorted(BAD_VALUES))
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_bad_step_value_fails_only_its_sub_env(kind, fault):
    venv = _vector(kind, fault)
    try:
        venv.reset(seed=SEEDS)
        venv.step(["go"] * len(SEEDS))
        _, rewards, terminated, truncated, info = venv.step(["go"] * len(SEEDS))  # step 2
        errors = info.get("error", [None] * len(SEEDS))
        for i in range(len(SEEDS)):
            if i in BAD:  # the failed step: truncated, no reward, the error naming env and field
                assert (rewards[i], terminated[i], truncated[i]) == (0.0, False, True)
                assert errors[i] == f"TypeError: env 'FaultyEnv' {EXPECTED[fault]}"
            else:
                assert (rewards[i], terminated[i], truncated[i]) == (0.0, False, False)
                assert not errors[i]
        # The healthy episodes go on to win (the failed ones restart with no fault: seed None).
        for _ in range(3):
            _, rewards, terminated, truncated, info = venv.step(["go"] * len(SEEDS))
        healthy = [i for i in range(len(SEEDS)) if i not in BAD]
        assert terminated[healthy].all() and (rewards[healthy] == 1.0).all()
        assert not truncated.any() and "error" not in info
    finally:
        venv.close()


@pytest.mark.parametrize(
    "value", [1, 2.5, float("nan"), -np.inf, np.float32(1), np.int8(3), np.array(0.5), True]
)
def test_real_scalar_rewards_pass_nan_included(value):
    assert step_value_error("E", value, False, np.bool_(True), {}) is None


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("reward", "1.0", "'1.0' (str)"),
        ("reward", None, "None (NoneType)"),
        ("reward", 1j, "1j (complex)"),
        ("reward", np.ones((1,)), "array([1.]) (numpy.ndarray of shape (1,))"),
        ("terminated", 1.0, "1.0 (float)"),
        ("terminated", 1, "1 (int)"),
        ("truncated", np.array(True), "array(True) (numpy.ndarray of shape ())"),
        ("info", None, "None (NoneType)"),
    ],
)
def test_each_field_is_checked_and_named(field, value, shown):
    values = {"reward": 0.0, "terminated": False, "truncated": False, "info": {}, field: value}
    message = step_value_error("E", **values)
    assert message is not None
    assert message.startswith(f"TypeError: env 'E' step returned {field}={shown}: expected ")


def test_a_reset_whose_info_is_not_a_dict_fails_that_reset():
    class ListInfo(FaultyEnv):
        def reset(self, *, seed=None, options=None):
            obs, info = super().reset(seed=seed, options=options)
            return obs, [info]

    obs, info = CatchErrors(ListInfo()).reset(seed=0)
    assert obs == ""
    assert re.fullmatch(
        r"TypeError: env 'ListInfo' reset returned info=\[\{.*\}\] \(list\): expected a dict",
        info["error"],
    )
