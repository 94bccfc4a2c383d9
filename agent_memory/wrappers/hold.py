"""Holding sub-envs back: a vector step in which only some envs act.

A Gymnasium vector env steps every sub-env on every ``step``; while its ``hold`` flag is set, a
:class:`Holdable` sub-env (the outermost wrapper) returns its last observation without touching
the env, so envs can be parked. :func:`make_vec_holdable` builds such a vector env.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, SupportsFloat, cast

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

__all__ = ["Holdable", "SubEnvHolds", "make_vec_holdable"]

#: What to tell a user whose sub-envs cannot be held.
HOLD_FIX = (
    "wrap each sub-env in agent_memory.wrappers.Holdable as its outermost wrapper (e.g. "
    "gym.make_vec(env_id, n, wrappers=[Holdable], vector_kwargs={'autoreset_mode': "
    "AutoresetMode.DISABLED})), or build the vector env with "
    "agent_memory.wrappers.make_vec_holdable(env_id, n)"
)


class Holdable(gym.Wrapper):
    """While ``hold`` is True, ``reset`` and ``step`` return the last observation without
    calling the env (see the module docstring).

    Example:
        >>> import gymnasium as gym
        >>> import agent_memory.envs  # registers the bundled text envs
        >>> env = Holdable(gym.make("agent_memory/Recall-v0"))
        >>> obs, _ = env.reset(seed=0)
        >>> env.hold = True
        >>> env.step("next") == (obs, 0.0, False, False, {})
        True
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.hold = False
        self._last_obs: Any = "" if isinstance(env.observation_space, gym.spaces.Text) else None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.hold:
            return self._last_obs, {}
        obs, info = self.env.reset(**kwargs)
        self._last_obs = obs
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if self.hold:
            return self._last_obs, 0.0, False, False, {}
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._last_obs = obs
        return obs, reward, terminated, truncated, info


def make_vec_holdable(
    env_id: str,
    num_envs: int,
    *,
    vectorization_mode: Literal["sync", "async"] = "sync",
    wrappers: Sequence[Callable[[gym.Env], gym.Wrapper]] = (),
    **kwargs: Any,
) -> VectorEnv:
    """A vector env of ``num_envs`` ``gym.make(env_id, **kwargs)`` sub-envs that can be held:
    autoreset DISABLED, ``wrappers`` applied to each sub-env, then :class:`Holdable` outermost
    (an async env gets ``shared_memory=False``: text observations need it).

    Example:
        >>> import agent_memory.envs  # registers the bundled text envs
        >>> venv = make_vec_holdable("agent_memory/Recall-v0", 2)
        >>> venv.metadata["autoreset_mode"], venv.get_attr("hold")
        (<AutoresetMode.DISABLED: 'Disabled'>, (False, False))
        >>> venv.close()
    """
    vector_kwargs: dict[str, Any] = {"autoreset_mode": AutoresetMode.DISABLED}
    if vectorization_mode == "async":
        vector_kwargs["shared_memory"] = False
    return gym.make_vec(
        env_id,
        num_envs,
        vectorization_mode=vectorization_mode,
        vector_kwargs=vector_kwargs,
        wrappers=[*wrappers, Holdable],
        **kwargs,
    )


class _BroadcastingVectorEnv(Protocol):
    """What Sync and Async vector envs add to ``VectorEnv``, and holding sub-envs needs."""

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]: ...

    def set_attr(self, name: str, values: Any) -> None: ...


class SubEnvHolds:
    """The ``hold`` flags of a vector env's :class:`Holdable` sub-envs, as last set here.

    Flags are sent only when they change (to the changed sub-envs of a SyncVectorEnv, else in
    one ``set_attr``); whether the sub-envs can be held is checked the first time one is held.
    """

    def __init__(self, env: VectorEnv) -> None:
        self.env = env.unwrapped
        self.flags = np.zeros(env.num_envs, dtype=bool)
        self._free = set(range(env.num_envs))  # the envs not held (their flag False)
        self._checked = False

    def hold_all_but(self, ids: Sequence[int]) -> None:
        """Hold every env but ``ids``. A SyncVectorEnv's flags are read and sent only for
        ``ids`` and the envs not held before: the cost follows them, not the batch."""
        if not isinstance(self.env, SyncVectorEnv):
            hold = np.ones_like(self.flags)
            hold[list(ids)] = False
            self.set(hold)
            return
        free = set(ids)
        newly_held = self._free - free
        if newly_held and not self._checked:
            self._check()
        flags, envs = self.flags, self.env.envs
        for i in sorted(newly_held):
            flags[i] = True
            envs[i].set_wrapper_attr("hold", True)
        for i in ids:
            if flags[i]:
                flags[i] = False
                envs[i].set_wrapper_attr("hold", False)
        self._free = free

    def set(self, hold: np.ndarray, finished: np.ndarray | None = None) -> np.ndarray:
        """Hold exactly the envs in ``hold``; returns those of them that were in ``finished``.

        A finished sub-env (its last step ended the episode, no reset since) that is held gets
        a reset of the base vector env that its :class:`Holdable` answers without touching it:
        with autoreset DISABLED, SyncVectorEnv refuses to step a finished sub-env, held or not
        (None: the held envs will not be stepped, none needs it).
        """
        if hold.any() and not self._checked:
            self._check()
        changed = np.flatnonzero(hold != self.flags)
        if changed.size:
            if isinstance(self.env, SyncVectorEnv):  # only the envs whose flag changes
                for i in changed.tolist():
                    self.env.envs[i].set_wrapper_attr("hold", bool(hold[i]))
            else:  # one message to every sub-env process (it has set_attr: _check passed)
                cast(_BroadcastingVectorEnv, self.env).set_attr("hold", hold.tolist())
            self.flags = hold.copy()
            self._free = set(np.flatnonzero(~hold).tolist())
        if finished is None:
            return np.zeros_like(hold)
        cleared = hold & finished
        if cleared.any():
            self.env.reset(options={"reset_mask": cleared.copy()})
        return cleared

    def release(self, mask: np.ndarray | None = None) -> None:
        """Hold no env of ``mask`` (None: no env at all)."""
        keep = np.zeros_like(self.flags) if mask is None else self.flags & ~mask
        if (keep != self.flags).any():
            self.set(keep)

    def _check(self) -> None:
        try:
            able = list(cast(_BroadcastingVectorEnv, self.env).call("has_wrapper_attr", "hold"))
        except Exception as e:  # a vector env without call(): it cannot hold either
            raise ValueError(
                f"step(mask=...) holds sub-envs back, but {type(self.env).__name__} cannot say "
                f"whether they can be held ({type(e).__name__}: {e}): {HOLD_FIX}"
            ) from e
        missing = [i for i, ok in enumerate(able) if not ok]
        if missing:
            raise ValueError(
                f"step(mask=...) holds sub-envs back, but sub-env(s) {missing} cannot be held "
                f"(no Holdable wrapper): {HOLD_FIX}"
            )
        self._checked = True
