"""``CatchErrors``: an exception inside one sub-env ends only that episode, not the rollout."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, SupportsFloat

import gymnasium as gym

from agent_memory.failures import describe_exception

__all__ = ["CatchErrors"]


class CatchErrors(gym.Wrapper):
    """Turns an exception in ``step`` into a truncated step with ``info["error"]`` (the last
    observation repeated), and one in ``reset`` into an empty observation with the error.

    ``SystemExit`` is caught, ``KeyboardInterrupt`` is not. With ``make``, the next ``reset``
    after a failure starts from a fresh env.

    Args:
        env: the env (usually ``make()``'s first result).
        frames: frames of the env's traceback kept in ``info["error"]``.
        make: builds a replacement env after a failure (e.g. ``lambda: gym.make(env_id)``).

    Example:
        >>> import gymnasium as gym
        >>> class Broken(gym.Env):
        ...     observation_space = action_space = gym.spaces.Discrete(2)
        ...     def reset(self, *, seed=None, options=None):
        ...         return 0, {}
        ...     def step(self, action):
        ...         raise RuntimeError("simulator crashed")
        >>> env = CatchErrors(Broken(), make=Broken)
        >>> _ = env.reset()
        >>> obs, reward, terminated, truncated, info = env.step(1)
        >>> obs, reward, terminated, truncated, info["error"].splitlines()[0]
        (0, 0.0, False, True, 'RuntimeError: simulator crashed')
        >>> env.reset()  # a fresh Broken() from make
        (0, {})
    """

    def __init__(
        self, env: gym.Env, frames: int = 4, *, make: Callable[[], gym.Env] | None = None
    ) -> None:
        super().__init__(env)
        self.frames = frames
        self.make = make
        self._broken = False
        self._last_obs: Any = None

    def _error(self, exc: BaseException) -> str:
        self._broken = True
        return describe_exception(exc, frames=self.frames)

    def _replace_if_broken(self) -> None:
        if not (self._broken and self.make is not None):
            return
        with contextlib.suppress(Exception):  # a crashed env may fail to close, too
            self.env.close()
        self.env = self.make()
        self._broken = False

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        try:
            self._replace_if_broken()
            obs, info = self.env.reset(**kwargs)
        except (Exception, SystemExit) as e:  # any env failure must stay inside this sub-env
            obs = "" if isinstance(self.observation_space, gym.spaces.Text) else self._last_obs
            return obs, {"error": self._error(e)}
        self._last_obs = obs
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except (Exception, SystemExit) as e:  # any env failure must stay inside this sub-env
            return self._last_obs, 0.0, False, True, {"error": self._error(e)}
        self._last_obs = obs
        return obs, reward, terminated, truncated, info
