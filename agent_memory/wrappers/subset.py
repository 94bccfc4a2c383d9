"""Stepping and resetting some sub-envs of a ``SyncVectorEnv``, leaving the others untouched.

``SyncVectorEnv.step`` calls every sub-env and rebuilds every batch array, so a vector step in
which a few envs of many act would cost in proportion to all of them. :class:`SyncSubset` does
what ``step`` and ``reset(options={"reset_mask": ...})`` of a ``SyncVectorEnv`` with autoreset
DISABLED and text spaces do for the sub-envs that act, and nothing for the others: the same
calls of those sub-envs, the same ``info`` (Gymnasium's own ``_add_info``, in env order), and
the vector env's own per-env state kept as its ``step`` and ``reset`` keep it.

Example:
    >>> import gymnasium as gym
    >>> from gymnasium.vector import AutoresetMode, SyncVectorEnv
    >>> import agent_memory.envs  # registers the bundled text envs
    >>> venv = SyncVectorEnv([lambda: gym.make("agent_memory/Recall-v0")] * 3,
    ...                      autoreset_mode=AutoresetMode.DISABLED)
    >>> SyncSubset.fits(venv)
    True
    >>> obs, info = SyncSubset(venv).reset([1], seed=0, options=None)
    >>> list(obs), info["_task"].tolist()
    ([1], [False, True, False])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

__all__ = ["SyncSubset"]

#: The per-env state of a ``SyncVectorEnv`` (Gymnasium 1.4) that its ``step`` and ``reset`` keep.
_STATE = ("_env_obs", "_rewards", "_terminations", "_truncations", "_autoreset_envs", "_add_info")


class SyncSubset:
    """``step`` and masked ``reset`` of some sub-envs of ``env`` (see the module docstring);
    build it only for an env that :meth:`fits`."""

    def __init__(self, env: SyncVectorEnv) -> None:
        self.env = env
        self.num_envs = env.num_envs

    @staticmethod
    def fits(env: VectorEnv) -> TypeGuard[SyncVectorEnv]:
        """Whether ``env`` is a ``SyncVectorEnv`` (its own ``step`` and ``reset``) with autoreset
        DISABLED and text observations and actions: then a sub-env's values pass through its
        ``step`` unchanged, and :class:`SyncSubset` gives what it gives."""
        return (
            isinstance(env, SyncVectorEnv)
            and type(env).step is SyncVectorEnv.step
            and type(env).reset is SyncVectorEnv.reset
            and env.autoreset_mode == AutoresetMode.DISABLED
            and isinstance(env.single_observation_space, spaces.Text)
            and isinstance(env.single_action_space, spaces.Text)
            and all(hasattr(env, name) for name in _STATE)
        )

    def step(
        self, ids: Sequence[int], actions: Sequence[Any]
    ) -> tuple[dict[int, Any], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step the sub-envs ``ids`` (in increasing order) with ``actions`` (one each; None
        sends ``""``, as a batch of text actions does). Returns each one's observation by env
        id, the rewards and ends of every env (0 and False for the others) and the info."""
        env, n = self.env, self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        terminated, truncated = np.zeros(n, dtype=np.bool_), np.zeros(n, dtype=np.bool_)
        env_obs, subs, add_info = env._env_obs, env.envs, env._add_info
        own_rewards, own_term, own_trunc = env._rewards, env._terminations, env._truncations
        done = env._autoreset_envs
        obs: dict[int, Any] = {}
        info: dict[str, Any] = {}
        for i, action in zip(ids, actions, strict=True):
            o, r, term, trunc, env_info = subs[i].step("" if action is None else action)
            env_obs[i] = obs[i] = o
            own_rewards[i] = rewards[i] = r
            own_term[i] = terminated[i] = term
            own_trunc[i] = truncated[i] = trunc
            done[i] = terminated[i] or truncated[i]
            info = add_info(info, env_info, i)
        return obs, rewards, terminated, truncated, info

    def reset(
        self, ids: Sequence[int], seed: Any, options: dict[str, Any] | None
    ) -> tuple[dict[int, Any], dict[str, Any]]:
        """Reset the sub-envs ``ids`` (in increasing order; at least one) with their seeds of
        ``seed`` (None, an int ``s`` giving env ``i`` the seed ``s + i``, or one per env) and
        ``options`` (without ``reset_mask``). Returns each one's observation by env id and the
        info.

        Raises:
            ValueError: ``seed`` is a sequence of another length than ``num_envs``.
        """
        env = self.env
        seed_of = self._seeds(seed)
        env_obs, subs, add_info = env._env_obs, env.envs, env._add_info
        own_term, own_trunc, done = env._terminations, env._truncations, env._autoreset_envs
        obs: dict[int, Any] = {}
        info: dict[str, Any] = {}
        for i in ids:
            own_term[i] = own_trunc[i] = done[i] = False
        for i in ids:
            o, env_info = subs[i].reset(seed=seed_of(i), options=options)
            env_obs[i] = obs[i] = o
            info = add_info(info, env_info, i)
        return obs, info

    def _seeds(self, seed: Any) -> Callable[[int], int | None]:
        """Env ``i``'s seed, as ``SyncVectorEnv.reset`` reads ``seed``."""
        n = self.num_envs
        if seed is None:
            return lambda i: None
        if isinstance(seed, int):
            return lambda i: seed + i
        if len(seed) != n:
            raise ValueError(
                "If seeds are passed as a list the length must match "
                f"num_envs={n} but got length={len(seed)}."
            )
        return seed.__getitem__
