"""``CatchErrors``: an exception inside one sub-env ends only that episode, not the rollout.

It also checks what a sub-env's ``step`` and ``reset`` return before the vector env sees it: a
reward that is not a real scalar, ``terminated``/``truncated`` that are not bools, or an info
that is not a mapping would make Gymnasium's vector step raise for every sub-env at once (or,
for ``"no"``, be read as True), so each becomes that sub-env's failed step instead.
"""

from __future__ import annotations

import contextlib
import numbers
import reprlib
from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from agent_memory.failures import describe_exception

__all__ = ["CatchErrors", "step_value_error"]

#: Types a reward may have without a closer look (the common ones, checked by identity).
_REWARD_TYPES = frozenset({float, int, np.float64, np.float32, np.int64, np.int32})
_BOOL_TYPES = (bool, np.bool_)
_REWARD = "a real scalar (int, float, numpy number or 0-d array; NaN and inf allowed)"
_BOOL = "a bool (or numpy.bool_)"
_INFO = "a dict"
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60


def _describe(value: Any) -> str:
    """``value`` in a few characters, with its type (and shape, for an array)."""
    kind = type(value)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    shape = getattr(value, "shape", None)
    extra = f" of shape {tuple(shape)}" if isinstance(shape, tuple) else ""
    return f"{_short.repr(value)} ({name}{extra})"


def _wrong(env: str, call: str, field: str, value: Any, expected: str) -> str:
    return f"TypeError: env {env!r} {call} returned {field}={_describe(value)}: expected {expected}"


def _real_scalar(value: Any) -> bool:
    if isinstance(value, (numbers.Real, np.integer, np.floating, np.bool_)):
        return True
    return isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biuf"


def step_value_error(
    env: str, reward: Any, terminated: Any, truncated: Any, info: Any
) -> str | None:
    """What is wrong with one sub-env's step values, as ``info["error"]`` says it; None when
    each has a type the vector env takes (NaN rewards are fine: the rows record them as null).

    Example:
        >>> step_value_error("Faulty-v0", 1.0, False, False, {}) is None
        True
        >>> print(step_value_error("Faulty-v0", 1.0, "no", False, {}))
        TypeError: env 'Faulty-v0' step returned terminated='no' (str): expected a bool \
(or numpy.bool_)
    """
    usual = type(reward) in _REWARD_TYPES and type(info) is dict
    if usual and type(terminated) in _BOOL_TYPES and type(truncated) in _BOOL_TYPES:
        return None  # without a closer look
    for field, value, ok, expected in (
        ("reward", reward, _real_scalar(reward), _REWARD),
        ("terminated", terminated, isinstance(terminated, _BOOL_TYPES), _BOOL),
        ("truncated", truncated, isinstance(truncated, _BOOL_TYPES), _BOOL),
        ("info", info, isinstance(info, Mapping), _INFO),
    ):
        if not ok:
            return _wrong(env, "step", field, value, expected)
    return None


class CatchErrors(gym.Wrapper):
    """Turns an exception in ``step`` into a truncated step with ``info["error"]`` (the last
    observation repeated), and one in ``reset`` into an empty observation with the error.

    A step whose reward, ``terminated``, ``truncated`` or info has the wrong type or shape
    (:func:`step_value_error`) is such a failed step too, as is a reset whose info is not a
    mapping: the vector env never sees the bad value, the other sub-envs' episodes go on.
    ``SystemExit`` is caught, ``KeyboardInterrupt`` is not. With ``make``, the next ``reset``
    after an exception starts from a fresh env.

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
        ...         if action == 0:
        ...             return 1, [1.0, 1.0, 1.0], False, False, {}
        ...         raise RuntimeError("simulator crashed")
        >>> env = CatchErrors(Broken(), make=Broken)
        >>> _ = env.reset()
        >>> obs, reward, terminated, truncated, info = env.step(1)
        >>> obs, reward, terminated, truncated, info["error"].splitlines()[0]
        (0, 0.0, False, True, 'RuntimeError: simulator crashed')
        >>> env.reset()  # a fresh Broken() from make
        (0, {})
        >>> print(env.step(0)[4]["error"])
        TypeError: env 'Broken' step returned reward=[1.0, 1.0, 1.0] (list): expected a real \
scalar (int, float, numpy number or 0-d array; NaN and inf allowed)
    """

    def __init__(
        self, env: gym.Env, frames: int = 4, *, make: Callable[[], gym.Env] | None = None
    ) -> None:
        super().__init__(env)
        self.frames = frames
        self.make = make
        self._broken = False
        self._last_obs: Any = None

    @property
    def env_name(self) -> str:
        """The env's registered id, else its class name (for error messages)."""
        spec = self.env.spec
        return spec.id if spec is not None else type(self.env.unwrapped).__name__

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

    def _empty_obs(self) -> Any:
        return "" if isinstance(self.observation_space, gym.spaces.Text) else self._last_obs

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        try:
            self._replace_if_broken()
            obs, info = self.env.reset(**kwargs)
        except (Exception, SystemExit) as e:  # any env failure must stay inside this sub-env
            return self._empty_obs(), {"error": self._error(e)}
        if not isinstance(info, Mapping):
            bad = _wrong(self.env_name, "reset", "info", info, _INFO)
            return self._empty_obs(), {"error": bad}
        self._last_obs = obs
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
        except (Exception, SystemExit) as e:  # any env failure must stay inside this sub-env
            return self._last_obs, 0.0, False, True, {"error": self._error(e)}
        bad = step_value_error(self.env_name, reward, terminated, truncated, info)
        if bad is not None:  # the env itself is intact: no fresh one at the next reset
            return self._last_obs, 0.0, False, True, {"error": bad}
        self._last_obs = obs
        return obs, reward, terminated, truncated, info
