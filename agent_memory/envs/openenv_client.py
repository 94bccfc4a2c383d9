"""OpenEnv as a Gymnasium text env: ``env=openenv`` plays an OpenEnv server, running or started.

`OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ (``openenv-core``) serves an env's ``reset``,
``step`` and ``state`` over a WebSocket session. :class:`OpenEnvTextEnv` talks to it through
OpenEnv's own client (``GenericEnvClient``, its synchronous wrapper) and maps it to the text
contract of :mod:`agent_memory.envs.base`, so ``gymnasium.vector`` and every memory strategy wrap it
as any bundled env:

- **action**: the text is sent as ``{action_field: text}`` (``"message"``, as OpenEnv's echo env
  and our own server, :mod:`agent_memory.openenv_server`, take it);
- **observation**: the field ``observation_field`` of the server's observation, else the whole
  observation as JSON (sorted keys); the contract's keys (``admissible_actions``, ``won``, ``task``,
  ``state_key``, ``is_action_valid``, ``invalid_reason``) found in it, not null, go to ``info``;
- **reward**: the server's, 0.0 where it sends none; **done**: ``terminated``, or ``truncated``
  where the observation says ``truncated: true`` (OpenEnv has one ``done`` flag);
- **seed**: passed on reset (``reset(seed=s)``). On its first seeded reset the env resets twice
  with that seed; different observations mean the server ignores the seed: a
  :class:`SeedIgnoredWarning`, and ``info["seed_honoured"]`` is False from then on;
- **errors**: a refused connection, a server error or a message that takes longer than
  ``message_timeout_s`` raise :class:`OpenEnvError` (the rollout's ``CatchErrors`` ends that
  episode as failed and makes a fresh env for the next one): never a hang.

With ``command`` instead of ``base_url`` the env starts the server itself (one per command and
process, shared by the sub-envs of a vector env, stopped when the last one closes); see
:mod:`agent_memory.envs.openenv_process`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym

from agent_memory.envs.base import (
    ADMISSIBLE_ACTIONS,
    INVALID_REASON,
    IS_ACTION_VALID,
    STATE_KEY,
    TASK,
    WON,
    sanitize,
    text_space,
)
from agent_memory.envs.openenv_process import ServerProcess, acquire_server, release_server

__all__ = ["INFO_KEYS", "OpenEnvError", "OpenEnvTextEnv", "SeedIgnoredWarning", "observation_text"]

#: Keys of the text contract copied from the server's observation into ``info`` where present.
INFO_KEYS: tuple[str, ...] = (
    ADMISSIBLE_ACTIONS,
    WON,
    TASK,
    STATE_KEY,
    IS_ACTION_VALID,
    INVALID_REASON,
)
#: ``info`` key: False once a server is seen to ignore ``seed`` (None before any seeded reset).
SEED_HONOURED = "seed_honoured"


class OpenEnvError(RuntimeError):
    """The OpenEnv server could not be reached, failed, or took too long to answer."""


class SeedIgnoredWarning(UserWarning):
    """Two resets with the same seed gave different observations: episodes do not repeat."""


def observation_text(observation: Mapping[str, Any], field: str | None) -> str:
    """The text of an OpenEnv observation: its ``field`` (a string; anything else as JSON), or
    the whole observation as JSON with sorted keys.

    Raises:
        OpenEnvError: ``field`` is not in the observation (names the fields it has).

    Example:
        >>> observation_text({"echoed_message": "hi", "message_length": 2}, None)
        '{"echoed_message": "hi", "message_length": 2}'
        >>> observation_text({"echoed_message": "hi"}, "echoed_message")
        'hi'
    """
    if field is None:
        return json.dumps(dict(observation), sort_keys=True)
    if field not in observation:
        raise OpenEnvError(
            f"the server's observation has no field {field!r} (it has: "
            f"{', '.join(sorted(observation)) or 'none'}): set env.kwargs.observation_field to "
            "one of them, or to null for the whole observation as JSON"
        )
    value = observation[field]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


class OpenEnvTextEnv(gym.Env[str, str]):
    """A Gymnasium text env played on an OpenEnv server (one WebSocket session per env).

    Args:
        base_url: the server (``http://host:port`` or ``ws://...``); or None with ``command``.
        command: argv that starts a server; ``{port}`` becomes a free loopback port and a first
            word ``python`` this interpreter (e.g. ``[python, -m, agent_memory.openenv_server,
            --port, "{port}", env=recall]``). Exactly one of ``base_url`` and ``command``.
        action_field: the action's field that carries the text.
        observation_field: the observation's field that is the text; None: the whole
            observation as JSON.
        connect_timeout_s: limit on opening the session.
        message_timeout_s: limit on each reset or step answer.
        start_timeout_s: limit on a started server's becoming healthy.
        check_seed: reset twice on the first seeded reset to detect a server that ignores seeds.
        max_chars: the observation space's length (longer observations are cut, ``"..."``).

    Example:
        >>> OpenEnvTextEnv(base_url="http://127.0.0.1:9", command=["python"])
        Traceback (most recent call last):
        ...
        ValueError: env.kwargs: give base_url (a running OpenEnv server) or command (argv that \
starts one), not both
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012

    def __init__(
        self,
        base_url: str | None = None,
        command: Sequence[str] | str | None = None,
        action_field: str = "message",
        observation_field: str | None = None,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
        check_seed: bool = True,
        max_chars: int = 100_000,
    ) -> None:
        if (base_url is None) == (command is None):
            which = "not both" if base_url is not None else "none was given"
            raise ValueError(
                "env.kwargs: give base_url (a running OpenEnv server) or command (argv that "
                f"starts one), {which}"
            )
        self.action_field = action_field
        self.observation_field = observation_field
        self.check_seed = check_seed
        self.observation_space = text_space(max_chars)
        self.action_space = text_space(max_chars)
        self._max_chars = max_chars
        self._server: ServerProcess | None = None
        if command is not None:
            self._server = acquire_server(command, start_timeout_s)
            base_url = self._server.base_url
        assert base_url is not None
        self.base_url = base_url
        self._timeouts = (connect_timeout_s, message_timeout_s)
        self._client: Any = None
        self.seed_honoured: bool | None = None

    # ------------------------------------------------------------------ the session

    def _session(self) -> Any:
        """OpenEnv's synchronous client, connected (a fresh one after a failure)."""
        if self._client is None:
            from openenv.core import GenericEnvClient

            connect, message = self._timeouts
            client = GenericEnvClient(
                base_url=self.base_url, connect_timeout_s=connect, message_timeout_s=message
            ).sync()
            self._client = client
            self._call("connect", client.connect)
        return self._client

    def _call(self, what: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(*args, **kwargs)``; a failure drops the session and raises OpenEnvError."""
        try:
            return call(*args, **kwargs)
        except Exception as e:  # any failure of the session ends the episode, never the run
            self._drop_session()
            detail = f"no answer within {self._timeouts[1]} s" if _is_timeout(e) else str(e)
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: {what} failed ({type(e).__name__}: {detail}); "
                "the episode ends as failed (limits: env.kwargs.connect_timeout_s, "
                "env.kwargs.message_timeout_s)"
            ) from e

    def _drop_session(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):  # a broken session may fail to close, too
                client.close()

    # ------------------------------------------------------------------ gymnasium

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on the server (``seed`` passed on); see the module's notes."""
        super().reset(seed=seed)
        client = self._session()
        kwargs = {} if seed is None else {"seed": int(seed)}
        result = self._call("reset", client.reset, **kwargs)
        if seed is not None and self.check_seed and self.seed_honoured is None:
            again = self._call("reset", client.reset, **kwargs)
            self.seed_honoured = _observed(again) == _observed(result)
            if not self.seed_honoured:
                warnings.warn(
                    f"OpenEnv server {self.base_url} ignores seed: two resets with seed={seed} "
                    "gave different observations, so its episodes do not repeat "
                    '(info["seed_honoured"] is False)',
                    SeedIgnoredWarning,
                    stacklevel=2,
                )
            result = again
        obs, info = self._read(result)
        return obs, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send the action's text; the observation's text, reward and done flags."""
        if self._client is None:
            raise OpenEnvError(f"OpenEnv server {self.base_url}: step before reset")
        result = self._call("step", self._client.step, {self.action_field: str(action)})
        obs, info = self._read(result)
        done = bool(result.done)
        truncated = done and bool(_observed(result).get("truncated", False))
        reward = 0.0 if result.reward is None else float(result.reward)
        return obs, reward, done and not truncated, truncated, info

    def close(self) -> None:
        """End the session; stop the server this env started when no other env uses it."""
        self._drop_session()
        if self._server is not None:
            release_server(self._server)
            self._server = None

    def _read(self, result: Any) -> tuple[str, dict[str, Any]]:
        observation = _observed(result)
        text = sanitize(observation_text(observation, self.observation_field), self._max_chars)
        info = {key: observation[key] for key in INFO_KEYS if observation.get(key) is not None}
        if self.seed_honoured is not None:
            info[SEED_HONOURED] = self.seed_honoured
        return text, info


def _observed(result: Any) -> dict[str, Any]:
    """The observation dict of a ``StepResult`` from ``GenericEnvClient``."""
    observation = result.observation
    if not isinstance(observation, Mapping):
        raise OpenEnvError(f"expected an observation object, got {type(observation).__name__}")
    return dict(observation)


def _is_timeout(error: BaseException) -> bool:
    return isinstance(error, (asyncio.TimeoutError, TimeoutError))
