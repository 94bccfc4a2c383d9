"""Turn any Discrete-action Gymnasium env into a text env, and solve tabular ones exactly.

:class:`TextAdapter` (behind :mod:`agent_memory.envs.toy_text`) takes your env, an observation
writer and a name per action, and speaks the text contract of :mod:`agent_memory.envs.base`.
:func:`greedy_policy` and :class:`TabularOracle` solve a Gymnasium transition table ``P`` by value
iteration, for use as ``oracle_fn``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, SupportsFloat, runtime_checkable

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from agent_memory.checks import check_int
from agent_memory.envs.base import (
    ADMISSIBLE_ACTIONS,
    STATE_KEY,
    TASK,
    WON,
    TextEnv,
    sanitize,
    stable_hash,
    step_info,
    text_space,
    unknown_action,
)
from agent_memory.text import squash

__all__ = [
    "AdmissibleFn",
    "ObsToText",
    "OracleFn",
    "StateKeyFn",
    "TabularOracle",
    "TextAdapter",
    "WonFn",
    "greedy_policy",
    "match_action",
    "normalize_action",
]

#: ``obs_to_text(env, obs) -> str``: the text the agent sees for the inner observation.
ObsToText = Callable[[gym.Env, Any], str]
#: ``won_fn(env, obs, reward, terminated, info) -> bool``: whether the step solved the task.
WonFn = Callable[[gym.Env, Any, float, bool, dict[str, Any]], bool]
#: ``state_key_fn(env, obs) -> str``: a stable key of the true state (equal states, equal keys).
StateKeyFn = Callable[[gym.Env, Any], str]
#: ``oracle_fn(env, obs) -> action index or action name``: the expert's next action.
OracleFn = Callable[[gym.Env, Any], "int | np.integer | str"]
#: ``admissible_fn(env, obs) -> names``: the actions valid now (default: every name).
AdmissibleFn = Callable[[gym.Env, Any], Sequence[str]]


def normalize_action(text: str, max_chars: int | None = None) -> str:
    """Case-fold and collapse whitespace: how a named action is matched after an exact miss.

    ``max_chars``: collapse only the first ``max_chars`` characters' worth of words (enough to
    tell a megabyte action from every name shorter than that, without reading it all).

    Example:
        >>> normalize_action("  Pick   UP "), normalize_action("  Pick   UP ", 3)
        ('pick up', 'pic')
    """
    return squash(text, max_chars).casefold()


def match_action(action: Any, admissible: Sequence[str]) -> tuple[str | None, str]:
    """The admissible action ``action`` names (exactly, else by :func:`normalize_action`) and
    ``""``, or None and why not (a non-string, or the admissible actions it is not among).

    Example:
        >>> match_action(" NEXT ", ["next", "red"]), match_action(3, ["next"])[1]
        (('next', ''), 'action must be a string, got int')
    """
    if not isinstance(action, str):
        return None, f"action must be a string, got {type(action).__name__}"
    if action in admissible:
        return action, ""
    by_norm = {normalize_action(a): a for a in admissible}
    # Case-folding never shortens text: past the longest name, an action matches none.
    wanted = normalize_action(action, max(map(len, by_norm), default=0) + 1)
    if wanted in by_norm:
        return by_norm[wanted], ""
    return None, unknown_action(action, admissible)


def _canonical(obs: Any) -> Any:
    """A plain-Python form of ``obs`` whose ``repr`` is stable across processes."""
    if isinstance(obs, bool | np.bool_):
        return bool(obs)
    if isinstance(obs, int | np.integer):
        return int(obs)
    if isinstance(obs, float | np.floating):
        return float(obs)
    if isinstance(obs, np.ndarray):
        return (str(obs.dtype), obs.shape, _canonical(obs.tolist()))
    if isinstance(obs, list | tuple):
        return tuple(_canonical(o) for o in obs)
    if isinstance(obs, Mapping):
        return tuple(sorted((str(k), _canonical(v)) for k, v in obs.items()))
    return obs


def _default_won(env: gym.Env, obs: Any, reward: float, terminated: bool, info: dict) -> bool:
    return terminated and reward > 0


class TextAdapter(TextEnv):
    """A text env over a Discrete-action env: named actions in, text observations out.

    It owns the env (``adapter.env``) rather than wrapping it, so ``adapter.unwrapped`` is the
    text env. Actions match exactly, then after :func:`normalize_action`; anything else is invalid
    (the inner env is not stepped). The inner env's info keys pass through.

    Args:
        env: The env to adapt (``spaces.Discrete`` actions).
        obs_to_text: ``(env, obs) -> str``: what the agent sees.
        action_names: One name per action, in index order (name ``i``: action ``start + i``).
        task: The task description put in ``info["task"]``.
        won_fn: ``(env, obs, reward, terminated, info) -> bool``; default: terminated, reward > 0.
        state_key_fn: ``(env, obs) -> str``; default: a stable hash of the inner observation.
        oracle_fn: ``(env, obs) -> action index or name``, called by :meth:`oracle_action`.
        admissible_fn: ``(env, obs) -> names`` valid now; default: all ``action_names``.
        invalid_action_reward: Reward of a step with an invalid action.
        max_obs_length: Observations are capped at this many characters.

    Raises:
        TypeError: ``env`` is not a ``gymnasium.Env``.
        ValueError: The action space is not Discrete, or the names do not fit it.

    Example:
        Wrap your own env in a few lines:

        >>> import gymnasium as gym
        >>> from gymnasium import spaces
        >>> from agent_memory.envs.text_adapter import TextAdapter
        >>> class Corridor(gym.Env):
        ...     observation_space, action_space = spaces.Discrete(4), spaces.Discrete(2)
        ...     def reset(self, *, seed=None, options=None):
        ...         super().reset(seed=seed)
        ...         self.pos = 0
        ...         return self.pos, {}
        ...     def step(self, action):
        ...         self.pos = min(max(self.pos + (1 if action == 1 else -1), 0), 3)
        ...         return self.pos, float(self.pos == 3), self.pos == 3, False, {}
        >>> env = TextAdapter(
        ...     Corridor(),
        ...     obs_to_text=lambda env, pos: "".join("@" if i == pos else "." for i in range(4)),
        ...     action_names=["left", "right"],
        ...     task="Walk to the right end of the corridor.",
        ...     oracle_fn=lambda env, pos: "right",
        ... )
        >>> obs, info = env.reset(seed=0)
        >>> obs, info["admissible_actions"]
        ('@...', ['left', 'right'])
        >>> obs, reward, terminated, truncated, info = env.step(" Right ")
        >>> obs, info["is_action_valid"]
        ('.@..', True)
        >>> obs, reward, terminated, truncated, info = env.step("jump")
        >>> obs, info["is_action_valid"], info["invalid_reason"]
        ('.@..', False, "unknown action 'jump'; admissible actions: left, right")
        >>> while not terminated:
        ...     obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        >>> obs, reward, info["won"]
        ('...@', 1.0, True)
    """

    def __init__(
        self,
        env: gym.Env,
        obs_to_text: ObsToText,
        action_names: Sequence[str],
        task: str = "",
        *,
        won_fn: WonFn | None = None,
        state_key_fn: StateKeyFn | None = None,
        oracle_fn: OracleFn | None = None,
        admissible_fn: AdmissibleFn | None = None,
        invalid_action_reward: float = 0.0,
        max_obs_length: int = 4096,
        render_mode: Literal["ansi"] | None = None,
    ) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"env must be a gymnasium.Env, got {type(env).__name__}")
        space = env.action_space
        if not isinstance(space, spaces.Discrete):
            raise ValueError(f"env.action_space must be gymnasium.spaces.Discrete, got {space!r}")
        if isinstance(action_names, str):
            raise ValueError(
                f"action_names must be a sequence of names, got the string {action_names!r}"
            )
        names = list(action_names)
        if len(names) != int(space.n):
            raise ValueError(
                f"action_names must name each of the {int(space.n)} actions of {space!r}, "
                f"got {len(names)} names: {names}"
            )
        bad = [n for n in names if not isinstance(n, str) or not n.strip()]
        if bad:
            raise ValueError(f"action_names must be non-empty strings, got {bad}")
        normalized = [normalize_action(n) for n in names]
        dups = sorted({n for n in normalized if normalized.count(n) > 1})
        if dups:
            raise ValueError(
                f"action_names must differ after lower-casing and collapsing whitespace, "
                f"got duplicates {dups} in {names}"
            )
        super().__init__(render_mode)
        check_int("max_obs_length", max_obs_length, 1)
        self.env = env
        self.task = task
        self.invalid_action_reward = float(invalid_action_reward)
        self.max_obs_length = max_obs_length
        self._names: tuple[str, ...] = tuple(names)
        self._start = int(space.start)
        self._exact = {n: i for i, n in enumerate(names)}
        self._normalized = {n: i for i, n in enumerate(normalized)}
        # Case-folding never shortens text: an action whose collapsed text is longer than every
        # name matches none, so its normalisation can stop there.
        self._norm_chars = max(map(len, normalized), default=0) + 1
        self._obs_to_text = obs_to_text
        self._won_fn: WonFn = won_fn or _default_won
        self._state_key_fn = state_key_fn
        self._oracle_fn = oracle_fn
        self._admissible_fn = admissible_fn

        self.observation_space = text_space(max_obs_length)
        self.action_space = text_space(max(64, 2 * max(len(n) for n in names)))

        self._obs: Any = None
        self._won = self._terminated = False
        self._inner_info: dict[str, Any] = {}

    # -- public helpers ------------------------------------------------------------------------

    @property
    def action_names(self) -> tuple[str, ...]:
        """The action names, in the inner action-index order."""
        return self._names

    @property
    def inner_obs(self) -> Any:
        """The inner env's latest observation (what ``obs_to_text`` was given)."""
        return self._obs

    @property
    def has_oracle(self) -> bool:
        """Whether :meth:`oracle_action` can answer (the adapter was given ``oracle_fn``).

        The rollout's preflight reads it to refuse ``policy=scripted`` without an oracle.
        """
        return self._oracle_fn is not None

    def admissible_actions(self) -> list[str]:
        """The action names valid now."""
        if self._admissible_fn is None:
            return list(self._names)
        return list(self._admissible_fn(self.env, self._obs))

    def oracle_action(self) -> str:
        """The expert's next action name, from ``oracle_fn`` on the current state.

        Raises:
            NotImplementedError: The adapter was built without ``oracle_fn``.
        """
        if self._oracle_fn is None:
            raise NotImplementedError("this TextAdapter has no oracle: pass oracle_fn=... to it")
        choice = self._oracle_fn(self.env, self._obs)
        if isinstance(choice, str):
            index, reason = self._match(choice)
            if index is None:
                raise ValueError(f"oracle_fn returned {choice!r}: {reason}")
            return self._names[index]
        index = int(choice) - self._start
        if not 0 <= index < len(self._names):
            raise ValueError(
                f"oracle_fn returned action {int(choice)}, outside "
                f"[{self._start}, {self._start + len(self._names) - 1}]"
            )
        return self._names[index]

    # -- gymnasium API -------------------------------------------------------------------------

    @property
    def np_random(self) -> np.random.Generator:
        """The inner env's generator, as a Gymnasium wrapper gives it: the adapter draws
        nothing itself, so a reset seeds the inner env only (a second generator per reset
        cost a third of it)."""
        return self.env.np_random

    @np_random.setter
    def np_random(self, value: np.random.Generator) -> None:
        self.env.np_random = value

    @property
    def np_random_seed(self) -> int:
        """The inner env's seed (see :attr:`np_random`)."""
        return int(self.env.np_random_seed)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        obs, inner_info = self.env.reset(seed=seed, options=options)
        self._np_random = self.env.np_random  # the same one, for code that reads the field
        self._obs = obs
        self._inner_info = dict(inner_info)
        self._won = self._terminated = False
        self._last_obs = self._make_text(obs)
        return self._last_obs, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        index, reason = self._match(action)
        if index is not None and self._admissible_fn is not None:
            admissible = self.admissible_actions()
            if self._names[index] not in admissible:
                reason = (
                    f"action {self._names[index]!r} is not admissible now; "
                    f"admissible actions: {', '.join(admissible)}"
                )
                index = None
        if index is None:
            info = step_info(self._info(), reason)
            return self._last_obs, self.invalid_action_reward, self._terminated, False, info

        obs, reward, terminated, truncated, inner_info = self.env.step(self._start + index)
        reward = float(reward)
        terminated, truncated = bool(terminated), bool(truncated)
        self._obs = obs
        self._inner_info = dict(inner_info)
        self._terminated = terminated
        self._won = bool(self._won_fn(self.env, obs, reward, terminated, self._inner_info))
        self._last_obs = self._make_text(obs)
        return self._last_obs, reward, terminated, truncated, step_info(self._info())

    def close(self) -> None:
        self.env.close()
        super().close()

    # -- internals -----------------------------------------------------------------------------

    def _match(self, action: Any) -> tuple[int | None, str]:
        """The action index of ``action`` (exact, then normalised), or None and the reason."""
        if not isinstance(action, str):
            return None, f"action must be a string, got {type(action).__name__}"
        index = self._exact.get(action)
        if index is None:
            index = self._normalized.get(normalize_action(action, self._norm_chars))
        if index is None:
            return None, unknown_action(action, self.admissible_actions())
        return index, ""

    def _make_text(self, obs: Any) -> str:
        return sanitize(self._obs_to_text(self.env, obs), self.max_obs_length)

    def _info(self) -> dict[str, Any]:
        # Fresh copies: Gymnasium requires infos that share no mutable object across calls
        # (a dict of immutable values needs no deep copy: the common case, e.g. {"prob": 1.0}).
        inner = self._inner_info
        if all(type(v) in _IMMUTABLE for v in inner.values()):
            info = dict(inner)
        else:
            info = copy.deepcopy(inner)
        info[TASK] = self.task
        info[ADMISSIBLE_ACTIONS] = self.admissible_actions()
        info[WON] = self._won
        if self._state_key_fn is not None:
            info[STATE_KEY] = str(self._state_key_fn(self.env, self._obs))
        else:
            info[STATE_KEY] = stable_hash("obs", _canonical(self._obs))
        return info


#: Value types an info dict can share across calls (nothing in them can change).
_IMMUTABLE = frozenset({int, float, bool, str, bytes, type(None)})

#: A Gymnasium transition table: ``P[state][action]`` lists ``(prob, next_state, reward, done)``.
TransitionTable = Mapping[int, Mapping[int, Sequence[tuple[float, int, SupportsFloat, bool]]]]


@runtime_checkable
class _Tabular(Protocol):
    """An env with a Gymnasium transition table (FrozenLake, CliffWalking, Taxi)."""

    P: TransitionTable


def greedy_policy(
    P: TransitionTable,
    *,
    gamma: float = 0.99,
    reward_fn: Callable[[int, int, int, float, bool], float] | None = None,
    tol: float = 1e-10,
    max_iterations: int = 100_000,
) -> np.ndarray:
    """The greedy policy of the optimal values of a tabular MDP (value iteration).

    A discount below 1 prefers shorter routes: on a deterministic table the policy follows a
    shortest path to the best outcome.

    Args:
        P: ``P[s][a]`` lists ``(probability, next_state, reward, terminated)``, as in Gymnasium.
        gamma: Discount in (0, 1].
        reward_fn: ``(state, action, next_state, reward, terminated) -> float`` replaces the
            table's reward.
        tol: Stop when no value changes by more than this.
        max_iterations: Upper bound on the sweeps.

    Returns:
        ``policy[s]``: the best action in state ``s`` (ties go to the lowest action index).

    Example:
        >>> P = {0: {0: [(1.0, 0, -1.0, False)], 1: [(1.0, 1, -1.0, False)]},
        ...      1: {0: [(1.0, 0, -1.0, False)], 1: [(1.0, 1, 10.0, True)]}}
        >>> greedy_policy(P).tolist()
        [1, 1]
    """
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    n_states = len(P)
    n_actions = len(P[0])
    table = []  # (row s * n_actions + a, probability, next state, reward, terminated)
    for s in range(n_states):
        for a in range(n_actions):
            for p, s2, r, done in P[s][a]:
                if reward_fn is not None:
                    r = reward_fn(s, a, int(s2), float(r), done)
                table.append((s * n_actions + a, float(p), int(s2), float(r), bool(done)))
    rows, probs, nexts, rewards, dones = (np.asarray(column) for column in zip(*table, strict=True))
    expected_reward = np.bincount(rows, probs * rewards, n_states * n_actions)
    cont = probs * gamma * ~dones  # no bootstrapping past a terminal transition
    values = np.zeros(n_states)
    q = expected_reward
    for _ in range(max_iterations):
        q = expected_reward + np.bincount(rows, cont * values[nexts], n_states * n_actions)
        new_values = q.reshape(n_states, n_actions).max(axis=1)
        delta = np.abs(new_values - values).max()
        values = new_values
        if delta <= tol:
            break
    q = q.reshape(n_states, n_actions)
    # First action within a hair of the best, so float noise cannot flip ties between runs.
    return np.argmax(q >= q.max(axis=1, keepdims=True) - 1e-9, axis=1)


class TabularOracle:
    """An ``oracle_fn`` for :class:`TextAdapter` over an env with a Gymnasium table ``P``.

    The policy comes from :func:`greedy_policy` (given ``gamma`` and ``reward_fn``) on
    ``env.unwrapped.P`` at the first call; the observation is the state index (as in FrozenLake,
    CliffWalking and Taxi).

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CliffWalking-v1")
        >>> obs, _ = env.reset(seed=0)
        >>> oracle = TabularOracle()
        >>> [int(oracle(env, s)) for s in (36, 24, 35)]  # start: up; then right; beside goal: down
        [0, 1, 2]
    """

    def __init__(
        self,
        *,
        gamma: float = 0.99,
        reward_fn: Callable[[int, int, int, float, bool], float] | None = None,
    ) -> None:
        self.gamma = gamma
        self.reward_fn = reward_fn
        self.policy: np.ndarray | None = None

    def __call__(self, env: gym.Env, obs: Any) -> int:
        if self.policy is None:
            game = env.unwrapped
            if not isinstance(game, _Tabular):
                raise TypeError(
                    f"TabularOracle needs an env with a table P, got {type(game).__name__}"
                )
            self.policy = greedy_policy(game.P, gamma=self.gamma, reward_fn=self.reward_fn)
        return int(self.policy[int(obs)])
