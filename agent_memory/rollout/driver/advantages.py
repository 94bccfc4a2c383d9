"""Advantage estimators over finished trajectories: GRPO, GiGPO and PPO's GAE (docs/rollouts.md).

Inputs are plain arrays per trajectory. A non-finite reward marks its trajectory missing
(advantage 0, left out of group statistics), so one broken reward never makes a group NaN. Finite
rewards give finite advantages: statistics are computed on values scaled by an exact power of two
below 1, and a result beyond the largest float saturates there.

Example:
    >>> import numpy as np
    >>> grpo([np.array([1.0, 0.0]), np.array([0.0]), np.array([3.0])], ["g", "g", "h"])
    [array([0.70710578, 0.70710578]), array([-0.70710578]), array([0.])]
"""

from __future__ import annotations

import dataclasses
import importlib
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from agent_memory.config import AlgoConfig
    from agent_memory.rollout.types import StepRecord, Trajectory

__all__ = [
    "FLOAT_MAX",
    "TrajectoryValues",
    "anchor",
    "compute_advantages",
    "discounted_returns",
    "episode_return",
    "gae",
    "gigpo",
    "group_normalize",
    "grpo",
    "load_value_fn",
]

#: The largest float: an advantage or return beyond it is written as this (never as inf).
FLOAT_MAX = float(np.finfo(np.float64).max)


def _exponent(values: np.ndarray, terms: int = 1) -> int:
    """The power of two ``E >= 0`` above ``terms`` times the largest finite ``|value|``: values
    divided by ``2**E`` (exactly: a power of two) add up ``terms`` at a time without overflow.

    Example:
        >>> _exponent(np.array([3.0, -1.0])), _exponent(np.array([3.0]), terms=4)
        (2, 4)
        >>> _exponent(np.array([1.5e308, np.inf]))
        1024
    """
    finite = np.abs(values[np.isfinite(values)])
    top = float(finite.max()) if finite.size else 0.0
    return max(0, int(np.frexp(top)[1]) + (terms - 1).bit_length())


def _unscale(x: Any, e: int) -> np.ndarray:
    """``x * 2**e``; a finite value that overflows saturates at :data:`FLOAT_MAX` (a non-finite
    one stays as it is).

    Example:
        >>> _unscale(np.array([0.75, -0.75]), 1025).tolist() == [FLOAT_MAX, -FLOAT_MAX]
        True
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        y = np.ldexp(x, e)
    over = np.isinf(y) & np.isfinite(x)
    return np.where(over, np.copysign(FLOAT_MAX, x), y) if over.any() else y


def group_normalize(
    values: Sequence[float],
    groups: Sequence[Hashable],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """``value - mean(group)``, divided by ``std(group, ddof=1) + eps`` when ``normalize_std``.

    A group of one gets 0. A non-finite value is missing: it gets 0, and its group's statistics
    are computed over the others. Finite values give finite results (see the module docstring).

    Example:
        >>> group_normalize([1.0, 3.0, 5.0], ["a", "a", "b"], normalize_std=False).tolist()
        [-1.0, 1.0, 0.0]
        >>> group_normalize([1.0, float("nan"), 3.0], ["a", "a", "a"], normalize_std=False).tolist()
        [-1.0, 0.0, 1.0]
        >>> group_normalize([2.0, 2.0], ["a", "a"], eps=0.0).tolist()
        [0.0, 0.0]
        >>> group_normalize([1.5e308, 1.5e308, 1.0, 0.0], ["a"] * 4).round(3).tolist()
        [0.866, 0.866, -0.866, -0.866]
    """
    x = np.asarray(values, dtype=np.float64)
    if len(x) != len(groups):
        raise ValueError(f"got {len(x)} values but {len(groups)} group ids")
    finite = np.isfinite(x)
    members: dict[Hashable, list[int]] = defaultdict(list)
    for j, g in enumerate(groups):
        if finite[j]:  # a missing value joins no group and keeps its 0
            members[g].append(j)
    out = np.zeros_like(x)
    for idx in members.values():
        if len(idx) < 2:
            continue
        e = _exponent(x[idx])
        v = np.ldexp(x[idx], -e)  # below 1: neither the sum nor the squares overflow
        centered = v - v.mean()
        if not normalize_std:
            out[idx] = _unscale(centered, e)
            continue
        scale = v.std(ddof=1) + np.ldexp(eps, -e)
        # Equal values with eps=0: 0/0. They are all at the mean: 0, not NaN.
        out[idx] = centered / scale if scale > 0 else 0.0
    return out


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}``, in one backward pass (a finite return beyond the
    largest float saturates there).

    Example:
        >>> discounted_returns(np.array([1.0, 0.0, 2.0]), 0.5).tolist()
        [1.5, 1.0, 2.0]
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    e = _exponent(rewards, len(rewards))  # |G_t| <= len(rewards) * max |r|, as gamma <= 1
    scaled = np.ldexp(rewards, -e)
    out = np.empty(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(scaled[t]) + gamma * running
        out[t] = running
    return _unscale(out, e)


def episode_return(rewards: np.ndarray) -> float:
    """The sum of ``rewards`` (a finite sum beyond the largest float saturates there).

    Example:
        >>> episode_return(np.array([1e308, 1e308])) == FLOAT_MAX
        True
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    e = _exponent(rewards, len(rewards))
    return float(_unscale(np.sum(np.ldexp(rewards, -e)), e))


def _common_exponent(rewards: Sequence[np.ndarray]) -> int:
    """:func:`_exponent` of every finite trajectory's rewards, for sums as long as the longest."""
    finite = [np.asarray(r, dtype=np.float64) for r in rewards if np.isfinite(r).all()]
    if not finite:
        return 0
    return _exponent(np.concatenate(finite), max(len(r) for r in finite))


def grpo(
    rewards: Sequence[np.ndarray],
    groups: Sequence[Hashable],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """GRPO advantages: one value per trajectory (its normalised return), broadcast to its steps.

    Args:
        rewards: per trajectory, its per-step rewards.
        groups: per trajectory, its group id (trajectories that started from the same state).
        normalize_std: divide by the group's std (Dr. GRPO-style runs turn it off).
    """
    # A non-finite reward makes the return non-finite (NaN for inf - inf): missing in the group.
    # Returns are summed divided by one power of two (their group statistics compare them).
    e = _common_exponent(rewards)
    returns = [float(np.sum(np.ldexp(r, -e))) if np.isfinite(r).all() else np.nan for r in rewards]
    adv = group_normalize(returns, groups, normalize_std=normalize_std, eps=np.ldexp(eps, -e))
    if not normalize_std:
        adv = _unscale(adv, e)
    return [np.full(len(r), a, dtype=np.float64) for r, a in zip(rewards, adv, strict=True)]


def gigpo(
    rewards: Sequence[np.ndarray],
    groups: Sequence[Hashable],
    state_keys: Sequence[Sequence[Hashable]],
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> list[np.ndarray]:
    """GiGPO advantages: GRPO's episode advantage plus ``step_weight`` x the step advantage.

    Args:
        rewards, groups: as for :func:`grpo`.
        state_keys: per trajectory, the ``state_key`` of the state each step's action was taken in.
        gamma: discount of the step-level returns.
        step_weight: weight of the step advantage (GiGPO's omega).
    """
    episode = grpo(rewards, groups, normalize_std=normalize_std, eps=eps)
    e = _common_exponent(rewards)  # the step returns are compared divided by 2**e
    flat_returns: list[float] = []
    flat_groups: list[tuple[Hashable, Hashable]] = []
    for r, g, keys in zip(rewards, groups, state_keys, strict=True):
        if len(keys) != len(r):
            raise ValueError(f"a trajectory has {len(r)} rewards but {len(keys)} state keys")
        r = np.asarray(r, dtype=np.float64)
        if np.isfinite(r).all():
            flat_returns.extend(discounted_returns(np.ldexp(r, -e), gamma))
        else:  # missing at every step, also where its later returns happen to be finite
            flat_returns.extend([np.nan] * len(r))
        flat_groups.extend((g, k) for k in keys)
    step = group_normalize(
        flat_returns, flat_groups, normalize_std=normalize_std, eps=np.ldexp(eps, -e)
    )
    if not normalize_std:
        step = _unscale(step, e)
    out, start = [], 0
    for ep in episode:
        with np.errstate(over="ignore"):
            total = ep + step_weight * step[start : start + len(ep)]
        out.append(np.clip(total, -FLOAT_MAX, FLOAT_MAX))
        start += len(ep)
    return out


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    *,
    terminated: bool,
    final_value: float = 0.0,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """GAE(gamma, lambda) of one trajectory.

    Args:
        rewards: per-step rewards ``r_0 .. r_{T-1}``.
        values: ``V(s_0) .. V(s_{T-1})``, the value of the state each action was taken in.
        terminated: whether the episode ended (no bootstrap) or was cut off.
        final_value: ``V(s_T)`` after the last step, used only when not terminated.

    Returns:
        ``(advantages, returns = advantages + values)``; advantages 0 when a reward is not finite.

    Example:
        >>> adv, ret = gae(np.array([1.0, 1.0]), np.array([0.5, 0.5]), terminated=False,
        ...                final_value=2.0, gamma=1.0, lam=1.0)
        >>> adv.tolist(), ret.tolist()
        ([3.5, 2.5], [4.0, 3.0])
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if rewards.shape != values.shape:
        raise ValueError(f"got {len(rewards)} rewards but {len(values)} values")
    n = len(rewards)
    if not np.isfinite(rewards).all():
        return np.zeros(n, dtype=np.float64), values.copy()
    # |delta| <= 3 max(|r|, |V|), |A_t| <= n times that, |A_t + V_t| <= 4n times: divided by
    # 2**e, nothing overflows.
    e = _exponent(np.concatenate([rewards, values, [final_value]]), 4 * max(n, 1))
    r, v = np.ldexp(rewards, -e), np.ldexp(values, -e)
    adv = np.empty(n, dtype=np.float64)
    next_value = 0.0 if terminated else float(np.ldexp(final_value, -e))
    running = 0.0
    for t in range(n - 1, -1, -1):
        delta = r[t] + gamma * next_value - v[t]
        running = delta + gamma * lam * running
        adv[t] = running
        next_value = v[t]
    return _unscale(adv, e), _unscale(adv + v, e)


ValueFn = Callable[[Sequence[Any]], Sequence[float]]


def load_value_fn(spec: str) -> ValueFn:
    """``"zero"`` (V = 0: GAE becomes discounted returns) or ``"module:function"``, a function
    taking a list of prompts and returning one value per prompt.

    Raises:
        ValueError: a spec of another form, or a name that does not resolve to a callable.
    """
    if spec == "zero":
        return lambda prompts: [0.0] * len(prompts)
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(
            f"algo.value_fn must be 'zero' or 'module:function', got {spec!r}: pass e.g. "
            "algo.value_fn=my_pkg.critic:values"
        )
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"algo.value_fn={spec!r} does not resolve: {e}") from e
    if not callable(fn):
        raise ValueError(f"algo.value_fn={spec!r} is not callable")
    return fn


@dataclass(frozen=True)
class TrajectoryValues:
    """A critic's values for one trajectory (PPO's GAE), given to :func:`compute_advantages`.

    Attributes:
        steps: ``V(s_0) .. V(s_{T-1})``, one per step.
        final: ``V(s_T)`` after the last step (GAE bootstraps an episode that did not terminate).
    """

    steps: Sequence[float]
    final: float = 0.0


Estimates = tuple[list[np.ndarray], list[np.ndarray]]


def compute_advantages(
    trajs: Sequence[Trajectory],
    algo: AlgoConfig,
    values: Mapping[str, TrajectoryValues] | None = None,
) -> None:
    """Fill every step's ``advantage`` and ``ret`` for ``algo`` (in place).

    Args:
        algo: the estimator and its parameters.
        values: PPO only: the values by ``traj_uid`` (None: ``algo.value_fn`` of the prompts).

    Raises:
        ValueError: ``values`` misses a trajectory or has the wrong number of steps.
    """
    full = [t for t in trajs if t.steps]
    # The env's steps only: a memory turn is no env step (it gets its action's figures below).
    trajs = [_actions(t) for t in full]
    if not trajs:
        return
    rewards = [np.array([s.reward for s in t.steps], dtype=np.float64) for t in trajs]
    estimate = _ESTIMATORS.get(algo.name, _ppo_estimates)
    advs, rets = estimate(trajs, rewards, algo, values)
    for t, a, ret in zip(trajs, advs, rets, strict=True):
        for s, av, rv in zip(t.steps, a, ret, strict=True):
            s.advantage = float(av)
            s.ret = float(rv)
    for t in full:
        _memory_turns_take_their_actions(t.steps)


def _actions(t: Trajectory) -> Trajectory:
    """``t`` without its memory turns (itself when it has none)."""
    if not any(s.memory_turn for s in t.steps):
        return t
    return dataclasses.replace(t, steps=[s for s in t.steps if not s.memory_turn])


def _memory_turns_take_their_actions(steps: Sequence[StepRecord]) -> None:
    """Each memory turn's advantage and return: those of the action it prepares (the next env
    step; the last one before it when the episode ended first). Under GRPO: the episode's."""
    after = None
    for s in reversed(steps):
        if not s.memory_turn:
            after = s
        elif after is not None:
            s.advantage, s.ret = after.advantage, after.ret
    before = None
    for s in steps:
        if not s.memory_turn:
            before = s
        elif s.advantage is None and before is not None:
            s.advantage, s.ret = before.advantage, before.ret


def _grpo_estimates(
    trajs: Sequence[Trajectory], rewards: list[np.ndarray], algo: AlgoConfig, _values: Any
) -> Estimates:
    groups = [t.spec.group_uid for t in trajs]
    advs = grpo(rewards, groups, normalize_std=algo.normalize_std, eps=algo.epsilon)
    return advs, [np.full(len(r), episode_return(r)) for r in rewards]


def _gigpo_estimates(
    trajs: Sequence[Trajectory], rewards: list[np.ndarray], algo: AlgoConfig, _values: Any
) -> Estimates:
    groups = [t.spec.group_uid for t in trajs]
    keys = [[anchor(t, s) for s in t.steps] for t in trajs]
    advs = gigpo(
        rewards,
        groups,
        keys,
        gamma=algo.gamma,
        step_weight=algo.step_weight,
        normalize_std=algo.normalize_std,
        eps=algo.epsilon,
    )
    return advs, [discounted_returns(r, algo.gamma) for r in rewards]


def _ppo_estimates(
    trajs: Sequence[Trajectory],
    rewards: list[np.ndarray],
    algo: AlgoConfig,
    values: Mapping[str, TrajectoryValues] | None,
) -> Estimates:
    """GAE with the ``values`` given (each checked as its turn comes), else ``algo.value_fn``'s."""
    per_traj: Iterable[tuple[np.ndarray, float]]
    if values is None:
        per_traj = _value_fn_values(trajs, rewards, algo)
    else:
        per_traj = (_given_values(t, r, values) for t, r in zip(trajs, rewards, strict=True))
    advs, rets = [], []
    for t, r, (v, final) in zip(trajs, rewards, per_traj, strict=True):
        a, ret = gae(
            r, v, terminated=t.terminated, final_value=final, gamma=algo.gamma, lam=algo.lam
        )
        advs.append(a)
        rets.append(ret)
    return advs, rets


def _given_values(
    t: Trajectory, r: np.ndarray, values: Mapping[str, TrajectoryValues]
) -> tuple[np.ndarray, float]:
    given = values.get(t.spec.traj_uid)
    if given is None or len(given.steps) != len(r):
        raise ValueError(
            f"values for trajectory {t.spec.traj_uid}: expected {len(r)} step values, "
            f"got {None if given is None else len(given.steps)}"
        )
    return np.asarray(given.steps, dtype=np.float64), float(given.final)


def _value_fn_values(
    trajs: Sequence[Trajectory], rewards: list[np.ndarray], algo: AlgoConfig
) -> list[tuple[np.ndarray, float]]:
    """``algo.value_fn``'s values of every step's prompt and, for the episodes that did not
    terminate, of their final prompt."""
    value_fn = load_value_fn(algo.value_fn)
    prompts = [s.prompt for t in trajs for s in t.steps]
    computed = np.asarray(value_fn(prompts), dtype=np.float64)
    if computed.shape != (len(prompts),):
        raise ValueError(
            f"algo.value_fn returned {computed.shape} values for {len(prompts)} prompts"
        )
    bootstrap = [t for t in trajs if not t.terminated]
    final_values = value_fn([t.final_prompt for t in bootstrap]) if bootstrap else []
    finals = dict(zip(map(id, bootstrap), final_values, strict=True))
    out, start = [], 0
    for t, r in zip(trajs, rewards, strict=True):
        out.append((computed[start : start + len(r)], float(finals.get(id(t), 0.0))))
        start += len(r)
    return out


#: ``algo.name`` -> its estimator (an unknown name gets PPO's, as it always has).
_ESTIMATORS: dict[str, Callable[..., Estimates]] = {
    "grpo": _grpo_estimates,
    "gigpo": _gigpo_estimates,
    "ppo": _ppo_estimates,
}


def anchor(t: Trajectory, s: Any) -> Any:
    """GiGPO's step-group key of step ``s``: the env's ``state_key``; for envs without one, the
    raw observation the action was taken on (verl-agent's anchor); else the step alone."""
    if s.state_key is not None:
        return ("state", s.state_key)
    if s.observation is not None:
        return ("observation", s.observation)
    return ("step", t.spec.traj_uid, s.step)
