"""Advantage estimators against values computed by hand."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agent_memory.config import AlgoConfig, ConfigError
from agent_memory.rollout.driver.advantages import (
    FLOAT_MAX,
    discounted_returns,
    episode_return,
    gae,
    gigpo,
    group_normalize,
    grpo,
)


def test_grpo_normalises_returns_per_trajectory_within_groups():
    # group a: returns 1, 3, 5 (mean 3, sample std 2); group b: a single trajectory.
    rewards = [np.array([0.5, 0.5]), np.array([3.0]), np.array([1.0, 1.0, 3.0]), np.array([7.0])]
    adv = grpo(rewards, ["a", "a", "a", "b"], eps=0.0)
    assert adv[0].tolist() == [-1.0, -1.0]  # (1 - 3) / 2, on both steps
    assert adv[1].tolist() == [0.0]
    assert adv[2].tolist() == [1.0, 1.0, 1.0]  # not weighted by the 3 steps
    assert adv[3].tolist() == [0.0]  # a group of one
    centred = grpo(rewards, ["a", "a", "a", "b"], normalize_std=False)
    assert [a[0] for a in centred] == [-2.0, 0.0, 2.0, 0.0]


def test_identical_returns_give_zero_not_nan():
    adv = grpo([np.array([1.0]), np.array([1.0])], ["g", "g"])
    assert [a.tolist() for a in adv] == [[0.0], [0.0]]


def test_discounted_returns():
    assert discounted_returns(np.array([0.0, 0.0, 1.0]), 0.9).tolist() == pytest.approx(
        [0.81, 0.9, 1.0]
    )


def test_gigpo_adds_step_advantage_within_shared_states():
    # Two trajectories of one group start in the same state s0; their first steps form a step
    # group. Trajectory 0: rewards [0, 1] (returns-to-go with gamma 0.5: [0.5, 1]);
    # trajectory 1: rewards [0, 0, 0] (returns-to-go [0, 0, 0]).
    rewards = [np.array([0.0, 1.0]), np.array([0.0, 0.0, 0.0])]
    keys = [["s0", "x"], ["s0", "y", "z"]]
    adv = gigpo(rewards, ["g", "g"], keys, gamma=0.5, step_weight=1.0, eps=0.0, normalize_std=False)
    # episode: returns 1 and 0 -> centred +0.5 / -0.5; step group {s0}: G = 0.5 and 0 -> +-0.25
    assert adv[0].tolist() == [0.5 + 0.25, 0.5 + 0.0]
    assert adv[1].tolist() == [-0.5 - 0.25, -0.5, -0.5]
    with pytest.raises(ValueError, match=re.escape("a trajectory has 2 rewards but 1 state keys")):
        gigpo(rewards, ["g", "g"], [["s0"], ["s0", "y", "z"]])


def test_gae_bootstraps_on_truncation_only():
    r = np.array([1.0, 0.0, 2.0])
    v = np.array([0.5, 1.0, 1.5])
    g, lam = 0.9, 0.8
    # terminated: V after the last step is 0
    d2 = 2.0 - 1.5
    d1 = 0.0 + g * 1.5 - 1.0
    d0 = 1.0 + g * 1.0 - 0.5
    a2 = d2
    a1 = d1 + g * lam * a2
    a0 = d0 + g * lam * a1
    adv, ret = gae(r, v, terminated=True, final_value=100.0, gamma=g, lam=lam)
    assert adv.tolist() == pytest.approx([a0, a1, a2])
    assert ret.tolist() == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 1.5])
    # truncated: bootstrap with the final state's value
    adv_t, _ = gae(r, v, terminated=False, final_value=2.0, gamma=g, lam=lam)
    assert adv_t[2] == pytest.approx(2.0 + g * 2.0 - 1.5)
    with pytest.raises(ValueError, match=re.escape("got 3 rewards but 2 values")):
        gae(r, v[:2], terminated=True)


def test_group_normalize_length_mismatch():
    with pytest.raises(ValueError, match=re.escape("got 2 values but 1 group ids")):
        group_normalize([1.0, 2.0], ["a"])


NAN, INF = float("nan"), float("inf")


def test_non_finite_values_are_missing_from_their_group():
    # group a: 1, NaN, 3 -> statistics over {1, 3}: mean 2, centred -1 / +1; NaN gets 0.
    # group b: inf alone -> missing, 0.
    out = group_normalize([1.0, NAN, 3.0, INF], ["a", "a", "a", "b"], normalize_std=False)
    assert out.tolist() == [-1.0, 0.0, 1.0, 0.0]
    # with the std: sample std of {1, 3} is sqrt(2)
    out = group_normalize([1.0, NAN, 3.0], ["a", "a", "a"], eps=0.0)
    assert out.tolist() == pytest.approx([-1 / np.sqrt(2), 0.0, 1 / np.sqrt(2)])
    # a group left with one finite member: 0 for it too
    assert group_normalize([5.0, -INF], ["a", "a"]).tolist() == [0.0, 0.0]


def test_grpo_a_nan_or_inf_reward_zeroes_only_its_own_trajectory():
    # returns: 1, (NaN), 0, (inf - inf = NaN), 2 -> group {1, 0, 2}: mean 1, sample std 1
    rewards = [
        np.array([1.0, 0.0]),
        np.array([NAN, 1.0]),
        np.array([0.0]),
        np.array([INF, -INF]),
        np.array([2.0]),
    ]
    adv = grpo(rewards, ["g"] * 5, eps=0.0)
    assert [a.tolist() for a in adv] == [[0.0, 0.0], [0.0, 0.0], [-1.0], [0.0, 0.0], [1.0]]
    assert all(np.isfinite(a).all() for a in adv)


def test_gigpo_leaves_a_trajectory_with_a_nan_reward_out_of_both_levels():
    # As in test_gigpo_adds_step_advantage_within_shared_states, plus a third trajectory in the
    # same state s0 whose last reward is NaN: it gets 0 everywhere and changes nothing else.
    rewards = [np.array([0.0, 1.0]), np.array([0.0, 0.0, 0.0]), np.array([5.0, NAN])]
    keys = [["s0", "x"], ["s0", "y", "z"], ["s0", "x"]]
    adv = gigpo(rewards, ["g"] * 3, keys, gamma=0.5, step_weight=1.0, eps=0.0, normalize_std=False)
    assert adv[0].tolist() == [0.5 + 0.25, 0.5 + 0.0]
    assert adv[1].tolist() == [-0.5 - 0.25, -0.5, -0.5]
    assert adv[2].tolist() == [0.0, 0.0]


def test_gae_with_a_non_finite_reward_gives_no_signal():
    v = np.array([0.5, 1.0, 1.5])
    for bad in (NAN, INF, -INF):
        adv, ret = gae(np.array([1.0, bad, 2.0]), v, terminated=False, final_value=2.0)
        assert adv.tolist() == [0.0, 0.0, 0.0] and ret.tolist() == v.tolist()


def test_equal_returns_with_epsilon_zero_get_zero_advantage_not_nan():
    """algo.epsilon=0 and a group whose returns are all equal: 0/0 was NaN (a null advantage
    in every row of a complete group)."""
    out = group_normalize([1.0, 1.0, 1.0, 0.0, 2.0], ["a", "a", "a", "b", "b"], eps=0.0)
    assert out.tolist() == [0.0, 0.0, 0.0, -1 / 2**0.5, 1 / 2**0.5]


@pytest.mark.parametrize(
    ("key", "value"), [("step_weight", float("nan")), ("epsilon", -1.0), ("epsilon", float("inf"))]
)
def test_a_non_finite_or_negative_advantage_setting_is_refused(key, value):
    with pytest.raises(
        ConfigError, match=re.escape(f"algo.{key} must be a finite number >= 0, got {value!r}")
    ):
        AlgoConfig(**{key: value})


# --- finite rewards, finite advantages ---------------------------------------------------------


def test_a_group_with_rewards_near_the_largest_float_gets_finite_advantages():
    """Issue 45: returns [1.5e308, 1.5e308, 1, 0] gave NaN to every member (the mean overflowed)."""
    rewards = [np.array([1.5e308]), np.array([1.5e308]), np.array([1.0]), np.array([0.0])]
    adv = [a[0] for a in grpo(rewards, ["g"] * 4)]
    # As for [1, 1, 0, 0] (1 and 0 are nothing beside 1.5e308): +-0.5 / sqrt(1/3).
    assert adv == pytest.approx([3**0.5 / 2, 3**0.5 / 2, -(3**0.5) / 2, -(3**0.5) / 2])
    # Centred only, the first members are 1.5e308 - 7.5e307 above the mean: representable.
    assert [a[0] for a in grpo(rewards, ["g"] * 4, normalize_std=False)] == pytest.approx(
        [7.5e307, 7.5e307, -7.5e307, -7.5e307]
    )
    # Sums beyond the largest float saturate there: the return, the discounted returns, GAE.
    assert episode_return(np.array([1e308, 1e308])) == FLOAT_MAX
    assert discounted_returns(np.array([1e308, 1e308]), 1.0).tolist() == [FLOAT_MAX, 1e308]
    adv_gae, ret = gae(np.array([1e308, 1e308]), np.array([-1e308, 0.0]), terminated=True)
    assert adv_gae.tolist() == [FLOAT_MAX, 1e308] and ret.tolist() == [FLOAT_MAX, 1e308]


FINITE = st.floats(allow_nan=False, allow_infinity=False)  # extremes, subnormals and -0 too
TRAJECTORIES = st.lists(
    st.tuples(st.sampled_from("abc"), st.lists(FINITE, min_size=1, max_size=4)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(
    trajs=TRAJECTORIES,
    normalize_std=st.booleans(),
    eps=st.sampled_from([0.0, 1e-6, 1.0]),
    gamma=st.floats(0, 1),
    lam=st.floats(0, 1),
    step_weight=st.floats(0, FLOAT_MAX),
)
@example(
    trajs=[("g", [1.5e308]), ("g", [1.5e308]), ("g", [1.0]), ("g", [0.0])],
    normalize_std=True,
    eps=1e-6,
    gamma=0.95,
    lam=0.95,
    step_weight=1.0,
)
def test_advantages_are_finite_for_any_finite_rewards(
    trajs, normalize_std, eps, gamma, lam, step_weight
):
    groups = [g for g, _ in trajs]
    rewards = [np.array(r, dtype=np.float64) for _, r in trajs]
    keys = [[len(r) % 2] * len(r) for r in rewards]  # some steps share a state across members
    with np.errstate(all="raise", under="ignore"):  # no overflow or 0/0 on the way, either
        outs = [
            *grpo(rewards, groups, normalize_std=normalize_std, eps=eps),
            *gigpo(
                rewards,
                groups,
                keys,
                gamma=gamma,
                step_weight=step_weight,
                normalize_std=normalize_std,
                eps=eps,
            ),
            *(discounted_returns(r, gamma) for r in rewards),
            np.array([episode_return(r) for r in rewards]),
        ]
        for r in rewards:  # a critic's values: the rewards reversed, as finite as they are
            outs += gae(r, r[::-1], terminated=False, final_value=r[0], gamma=gamma, lam=lam)
    for out in outs:
        assert np.isfinite(out).all(), out


def _textbook_normalize(x, groups, normalize_std, eps):
    """group_normalize as written before issue 45 (no scaling)."""
    x, out = np.asarray(x, dtype=np.float64), np.zeros(len(x))
    for g in set(groups):
        idx = [j for j, h in enumerate(groups) if h == g]
        if len(idx) > 1:
            v = x[idx]
            scale = v.std(ddof=1) + eps if normalize_std else 1.0
            out[idx] = (v - v.mean()) / scale if scale > 0 else 0.0
    return out


def _textbook_discounted(r, gamma):
    out, running = [], 0.0
    for x in r[::-1]:
        running = x + gamma * running
        out.append(running)
    return out[::-1]


def _textbook_gae(r, v, final, gamma, lam):
    adv, running, nxt = np.empty(len(r)), 0.0, final
    for t in range(len(r) - 1, -1, -1):
        running = r[t] + gamma * nxt - v[t] + gamma * lam * running
        adv[t], nxt = running, v[t]
    return adv, adv + v


ORDINARY = st.one_of(
    st.integers(-1000, 1000).map(float),
    st.floats(-1e6, 1e6).filter(lambda x: x == 0 or abs(x) > 1e-100),
)
#: A discount or GAE lambda that is not near the subnormal range (where gamma * lam * x loses
#: bits to underflow whichever way it is scaled: extremes are the finiteness test's business).
ORDINARY_RATE = st.floats(0, 1).filter(lambda x: x == 0 or x > 1e-100)


@settings(max_examples=200, deadline=None)
@given(
    trajs=st.lists(
        st.tuples(st.sampled_from("ab"), st.lists(ORDINARY, min_size=1, max_size=4)),
        min_size=1,
        max_size=6,
    ),
    normalize_std=st.booleans(),
    gamma=ORDINARY_RATE,
    lam=ORDINARY_RATE,
)
@example(trajs=[("a", [0.0, 0.0])], normalize_std=False, gamma=0.6727947874578121, lam=1e-100)
def test_ordinary_rewards_get_the_same_bits_as_the_textbook_formulas(
    trajs, normalize_std, gamma, lam
):
    """The scaling that keeps extremes finite is by powers of two: exact for ordinary rewards."""
    groups = [g for g, _ in trajs]
    rewards = [np.array(r, dtype=np.float64) for _, r in trajs]
    returns = [float(np.sum(r)) for r in rewards]
    want = _textbook_normalize(returns, groups, normalize_std, 1e-6)
    got = [a[0] for a in grpo(rewards, groups, normalize_std=normalize_std)]
    assert got == want.tolist()
    keys = [[len(r) % 2] * len(r) for r in rewards]
    flat = [g for r in rewards for g in _textbook_discounted(r, gamma)]
    step_groups = [(g, k) for g, ks in zip(groups, keys, strict=True) for k in ks]
    step = _textbook_normalize(flat, step_groups, normalize_std, 1e-6)
    episode = [a for r, a in zip(rewards, want, strict=True) for _ in r]
    want_gigpo = [w + s for w, s in zip(episode, step, strict=True)]
    got_gigpo = gigpo(rewards, groups, keys, gamma=gamma, normalize_std=normalize_std)
    assert np.concatenate(got_gigpo).tolist() == want_gigpo
    for r in rewards:
        assert episode_return(r) == float(np.sum(r))
        values = r[::-1] / 3
        want_adv, want_ret = _textbook_gae(r, values, 0.5, gamma, lam)
        got_adv, got_ret = gae(r, values, terminated=False, final_value=0.5, gamma=gamma, lam=lam)
        assert got_adv.tolist() == want_adv.tolist() and got_ret.tolist() == want_ret.tolist()
