"""Advantage estimators over finished trajectories: GRPO, GiGPO and PPO's GAE.

Inputs are plain arrays per trajectory, so the functions are independent of how rollouts were
collected. All work in O(total steps).

* **GRPO** — each trajectory's return (sum of its rewards) is normalised within its group:
  ``(R - mean) / (std + eps)`` with the sample std (``ddof=1``, as verl's GRPO); every step of the
  trajectory gets that advantage. Statistics are over trajectories, not steps, so long episodes do
  not weigh more. A group of one has advantage 0 (nothing to compare against).
* **GiGPO** (Feng et al., 2025) — the GRPO episode advantage plus ``step_weight`` times a step
  advantage: steps of the same group whose pre-action states share a ``state_key`` form a step
  group, and each step's discounted return ``G_t = r_t + gamma * G_{t+1}`` is normalised within
  its step group (a step group of one gets 0).
* **PPO / GAE(gamma, lambda)** — ``delta_t = r_t + gamma * V_{t+1} - V_t``; after the last step,
  ``V`` is 0 when the episode terminated and the value of the final state when it was truncated
  (the episode did not end, the time limit did: bootstrap). Returns are ``A + V``.

**Non-finite rewards** (NaN, ±inf: a broken reward function or env) are treated as missing, so
one bad trajectory never turns its whole group's advantages into NaN: a trajectory with any
non-finite reward gets advantage 0 at every step (no learning signal, and nothing for a trainer
to mask) and is left out of every group statistic (GRPO's and GiGPO's episode groups, GiGPO's
step groups), which the other members then compute among themselves; GAE gives it advantages 0
and returns equal to its values (no policy or value signal). :func:`group_normalize` does the
same per value. Trainers that want to see such trajectories find them by their rewards.

Example:
    >>> import numpy as np
    >>> grpo([np.array([1.0, 0.0]), np.array([0.0]), np.array([3.0])], ["g", "g", "h"])
    [array([0.70710578, 0.70710578]), array([-0.70710578]), array([0.])]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = ["discounted_returns", "gae", "gigpo", "group_normalize", "grpo"]


def group_normalize(
    values: Sequence[float], groups: Sequence[Hashable], *, normalize_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:  # fmt: skip
    """``value - mean(group)``, divided by ``std(group, ddof=1) + eps`` when ``normalize_std``.

    Members of a group of one get 0. A non-finite value (NaN, ±inf) is missing: it gets 0 and
    its group's statistics are computed over the other members.

    Example:
        >>> group_normalize([1.0, 3.0, 5.0], ["a", "a", "b"], normalize_std=False).tolist()
        [-1.0, 1.0, 0.0]
        >>> group_normalize([1.0, float("nan"), 3.0], ["a", "a", "a"], normalize_std=False).tolist()
        [-1.0, 0.0, 1.0]
    """
    values = np.asarray(values, dtype=np.float64)
    if len(values) != len(groups):
        raise ValueError(f"got {len(values)} values but {len(groups)} group ids")
    finite = np.isfinite(values)
    members: dict[Hashable, list[int]] = defaultdict(list)
    for j, g in enumerate(groups):
        if finite[j]:  # a missing value joins no group and keeps its 0
            members[g].append(j)
    out = np.zeros_like(values)
    for idx in members.values():
        if len(idx) < 2:
            continue
        v = values[idx]
        centered = v - v.mean()
        out[idx] = centered / (v.std(ddof=1) + eps) if normalize_std else centered
    return out


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}``, in one backward pass.

    Example:
        >>> discounted_returns(np.array([1.0, 0.0, 2.0]), 0.5).tolist()
        [1.5, 1.0, 2.0]
    """
    out = np.empty(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = float(rewards[t]) + gamma * running
        out[t] = running
    return out


def grpo(
    rewards: Sequence[np.ndarray], groups: Sequence[Hashable], *, normalize_std: bool = True,
    eps: float = 1e-6,
) -> list[np.ndarray]:  # fmt: skip
    """GRPO advantages: one value per trajectory (its normalised return), broadcast to its steps.

    Args:
        rewards: per trajectory, its per-step rewards.
        groups: per trajectory, its group id (trajectories that started from the same state).
        normalize_std: divide by the group's std (Dr. GRPO-style runs turn it off).
    """
    # A non-finite reward makes the return non-finite (NaN for inf - inf): missing in the group.
    returns = [float(np.sum(r)) if np.isfinite(r).all() else np.nan for r in rewards]
    adv = group_normalize(returns, groups, normalize_std=normalize_std, eps=eps)
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
        rewards: per trajectory, its per-step rewards.
        groups: per trajectory, its group id.
        state_keys: per trajectory, the ``state_key`` of the state each step's action was taken in.
        gamma: discount of the step-level returns.
        step_weight: weight of the step advantage (GiGPO's omega).
    """
    episode = grpo(rewards, groups, normalize_std=normalize_std, eps=eps)
    flat_returns: list[float] = []
    flat_groups: list[tuple[Hashable, Hashable]] = []
    for r, g, keys in zip(rewards, groups, state_keys, strict=True):
        if len(keys) != len(r):
            raise ValueError(f"a trajectory has {len(r)} rewards but {len(keys)} state keys")
        r = np.asarray(r, dtype=np.float64)
        if np.isfinite(r).all():
            flat_returns.extend(discounted_returns(r, gamma))
        else:  # missing at every step, also where its later returns happen to be finite
            flat_returns.extend([np.nan] * len(r))
        flat_groups.extend((g, k) for k in keys)
    step = group_normalize(flat_returns, flat_groups, normalize_std=normalize_std, eps=eps)
    out, start = [], 0
    for ep in episode:
        out.append(ep + step_weight * step[start : start + len(ep)])
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
        final_value: ``V(s_T)`` of the state after the last step, used only when not terminated
            (truncation, or a rollout stopped mid-episode).

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + values``; advantages 0 (returns
        = values) when a reward is not finite.

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
    adv = np.empty(n, dtype=np.float64)
    next_value = 0.0 if terminated else float(final_value)
    running = 0.0
    for t in range(n - 1, -1, -1):
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
        next_value = values[t]
    return adv, adv + values
