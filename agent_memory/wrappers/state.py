"""Per-env episode state: one owner writes it, everyone else reads it.

:class:`EpisodeState` holds, per env, what its next prompt is built from and what its hand-over
reports. Only :class:`~agent_memory.wrappers.recorder.EpisodeRecorder` writes it; users read it
through :class:`EnvView` (``env.current(i)``). Steps taken are counted by the memory.

Example:
    >>> state = EpisodeState(2, task="Find the key.")
    >>> state.start([1], ["A hall."], [{"task": "generic", "admissible_actions": ("go", "look")}])
    >>> state.observation(1), state.task(1), state.admissible(1)
    ('A hall.', 'Find the key.', ['go', 'look'])
    >>> EpisodeState(1).task(0) is None  # no configured task and no env task yet
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agent_memory.protocol import ADMISSIBLE_ACTIONS, TASK
from agent_memory.text import utf8_safe
from agent_memory.tool_actions import PARALLEL_TOOL_CALLS, TOOLS, check_tools

__all__ = ["EnvView", "EpisodeState", "env_ids_arg"]


@dataclass(frozen=True)
class EnvView:
    """What env ``i`` shows its policy now (a copy: changing the wrapper later changes nothing).

    Attributes:
        observation: the current observation as text (no history, no template).
        task: the task as the prompt shows it (the template's, else the env's).
        admissible_actions: the actions valid now (None where not finite or unknown).
        episode_step: steps taken in the running episode.
        episode_return: the sum of its rewards so far (penalties included).
        tools: the tools the env declared (``info["tools"]``; None: none, a tool-calling policy
            gets :func:`~agent_memory.tool_actions.act_tool` of the admissible actions).
    """

    observation: str
    task: str | None
    admissible_actions: tuple[Any, ...] | None
    episode_step: int
    episode_return: float
    tools: tuple[dict[str, Any], ...] | None = None


def env_ids_arg(ids: Sequence[int], num_envs: int) -> list[int] | None:
    """What to pass a memory as ``env_ids``: None when ``ids`` are every env in order (the
    memory's own list of them, checked once), else ``ids``."""
    ids = list(ids)
    return None if len(ids) == num_envs and ids == list(range(num_envs)) else ids


def _object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (each kept as is, lists included)."""
    arr = np.empty(len(values), dtype=object)
    for j, v in enumerate(values):
        arr[j] = v
    return arr


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """An env's declared tools as plain dicts, checked (None or empty: none declared).

    Raises:
        ValueError: not a list of OpenAI function tools (the message names ``info["tools"]``).
    """
    if value is None or (isinstance(value, (list, tuple, np.ndarray)) and len(value) == 0):
        return None
    return check_tools(_listify(value), 'info["tools"]')


def _listify(value: Any) -> list[Any] | None:
    if isinstance(value, np.ndarray):
        return value.tolist()
    return None if value is None else list(value)


class EpisodeState:
    """The state of the running episode of each of ``num_envs`` envs (see the module).

    Args:
        task: the template's configured task: when set, every env's (over ``info["task"]``).
    """

    def __init__(self, num_envs: int, task: str = "") -> None:
        self.num_envs = num_envs
        self.configured_task = task
        self._obs: list[str] = [""] * num_envs
        self._obs_array = _object_array(self._obs)  # the same texts, copied in one call
        self._env_tasks: list[str | None] = [None] * num_envs
        self._admissible: list[list[Any] | None] = [None] * num_envs
        #: The tools each env declared (None: none) and whether it takes parallel calls.
        self._tools: list[list[dict[str, Any]] | None] = [None] * num_envs
        self._parallel: list[bool] = [False] * num_envs
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._handed_over = np.zeros(num_envs, dtype=bool)
        self._shown: list[str] = [""] * num_envs

    def observation(self, i: int) -> str:
        """Env ``i``'s current observation text."""
        return self._obs[i]

    def observations_of(self, ids: Sequence[int]) -> list[str]:
        """The current observation texts of ``ids``, in that order."""
        obs = self._obs
        return [obs[i] for i in ids]

    def tasks_of(self, ids: Sequence[int]) -> list[str | None]:
        """:meth:`task` of each env of ``ids``."""
        if self.configured_task:
            return [self.configured_task] * len(ids)
        tasks = self._env_tasks
        return [tasks[i] for i in ids]

    def admissibles_of(self, ids: Sequence[int]) -> list[list[Any] | None]:
        """:meth:`admissible` of each env of ``ids``."""
        admissible = self._admissible
        return [admissible[i] for i in ids]

    def tools_of(self, ids: Sequence[int]) -> list[list[dict[str, Any]] | None]:
        """The tools each env of ``ids`` declared (None: none)."""
        tools = self._tools
        return [tools[i] for i in ids]

    def parallel_of(self, ids: Sequence[int]) -> list[bool]:
        """Whether each env of ``ids`` takes several tool calls in one response."""
        parallel = self._parallel
        return [parallel[i] for i in ids]

    def observations(self) -> np.ndarray:
        """Every env's current observation text (a new object array)."""
        return self._obs_array.copy()

    def task(self, i: int) -> str | None:
        """Env ``i``'s task as its prompt shows it: the configured one, else the env's."""
        return self.configured_task or self._env_tasks[i]

    def admissible(self, i: int) -> list[Any] | None:
        """Env ``i``'s admissible actions (None: unknown); do not change the list."""
        return self._admissible[i]

    def episode_return(self, i: int) -> float:
        """Rewards env ``i`` collected in its running episode."""
        return float(self._returns[i])

    def handed_over(self, i: int) -> bool:
        """Whether env ``i``'s running episode was already handed over (it ended)."""
        return bool(self._handed_over[i])

    def shown(self, i: int) -> str:
        """The text env ``i``'s policy was last shown (kept only for transcript records)."""
        return self._shown[i]

    def start(self, ids: Sequence[int], texts: Sequence[str], infos: Sequence[Mapping]) -> None:
        """New episodes in ``ids``, from their first observations and reset infos."""
        obs, obs_array = self._obs, self._obs_array
        for i, text, info in zip(ids, texts, infos, strict=True):
            obs[i] = obs_array[i] = text
            task = info.get(TASK)
            self._env_tasks[i] = utf8_safe(task) if isinstance(task, str) else task
            self._admissible[i] = _listify(info.get(ADMISSIBLE_ACTIONS))
            self._tools[i] = _tools(info.get(TOOLS))
            self._parallel[i] = bool(info.get(PARALLEL_TOOL_CALLS, False))
            self._handed_over[i] = False
            self._returns[i] = 0.0

    def observe(self, ids: Sequence[int], texts: Sequence[str], infos: Sequence[Mapping]) -> None:
        """The envs in ``ids`` moved on within their episodes."""
        obs, obs_array = self._obs, self._obs_array
        for i, text, info in zip(ids, texts, infos, strict=True):
            obs[i] = obs_array[i] = text
            if ADMISSIBLE_ACTIONS in info:
                self._admissible[i] = _listify(info[ADMISSIBLE_ACTIONS])
            if TOOLS in info:
                self._tools[i] = _tools(info[TOOLS])
            if PARALLEL_TOOL_CALLS in info:
                self._parallel[i] = bool(info[PARALLEL_TOOL_CALLS])

    def add_rewards(self, ids: Sequence[int], rewards: Sequence[float] | np.ndarray) -> None:
        """Add each env's step reward to its return."""
        self._returns[list(ids)] += rewards

    def mark_handed_over(self, ids: Sequence[int]) -> None:
        """The running episodes of ``ids`` were handed over."""
        self._handed_over[list(ids)] = True

    def show(self, ids: Sequence[int], texts: Sequence[str]) -> None:
        """What the policies of ``ids`` are shown now."""
        for i, text in zip(ids, texts, strict=True):
            self._shown[i] = text

    def state_dict(self) -> dict[str, Any]:
        """The state as JSON-able values (the session file's keys)."""
        return {
            "last_obs": list(self._obs),
            "tasks": list(self._env_tasks),
            "admissible": [None if a is None else list(a) for a in self._admissible],
            "tools": list(self._tools),
            "parallel_tool_calls": list(self._parallel),
            "handed_over": self._handed_over.tolist(),
            "returns": self._returns.tolist(),
            "shown": list(self._shown),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` (``shown`` may be absent: sessions saved before it)."""
        self._obs = list(state["last_obs"])
        self._obs_array = _object_array(self._obs)
        self._env_tasks = list(state["tasks"])
        self._admissible = [None if a is None else list(a) for a in state["admissible"]]
        self._handed_over = np.array(state["handed_over"], dtype=bool)
        self._returns = np.array(state["returns"], dtype=np.float64)
        self._shown = list(state.get("shown", [""] * self.num_envs))
        # (sessions saved before tool calls have neither)
        self._tools = list(state.get("tools", [None] * self.num_envs))
        self._parallel = list(state.get("parallel_tool_calls", [False] * self.num_envs))
