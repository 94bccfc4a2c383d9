"""verl-agent drop-in: ``SimpleMemory`` and ``SearchMemory`` with its exact signatures and output.

Switch by changing one import (``from agent_memory.compat.verl import SimpleMemory``); contexts
are byte-identical, built on :class:`~agent_memory.memory.HistoryMemory`. Misuse raises where
verl does not: record keys that differ from the batch's, and a negative ``history_length``.
:class:`~agent_memory.compat.verl_env.MemoryEnvironmentManager` is re-exported here.

Example:
    >>> mem = SimpleMemory()
    >>> mem.reset(batch_size=2)
    >>> mem.store({"text_obs": ["You see a desk", "A hall"], "action": ["go to desk 1", "look"]})
    >>> contexts, valid_lengths = mem.fetch(3, obs_key="text_obs", action_key="action")
    >>> contexts[0], valid_lengths
    ("[Observation 1: 'You see a desk', Action 1: 'go to desk 1']", [1, 1])
    >>> len(mem), mem[1]
    (2, [{'text_obs': 'A hall', 'action': 'look'}])
"""

from __future__ import annotations

from typing import Any

from agent_memory.compat.verl_env import MemoryEnvironmentManager
from agent_memory.formatting import Formatter
from agent_memory.memory import HistoryMemory

__all__ = ["MemoryEnvironmentManager", "SearchMemory", "SimpleMemory"]


class _KeysNotYetKnown(Formatter):
    """Stands in until a fetch names the record keys (verl passes them to fetch, not store)."""

    def render(self, record: Any, step: int) -> str:
        return ""

    def text_of(self, rendered: str) -> str:
        return ""


class _VerlMemory:
    _formatter_name: str

    def __init__(self) -> None:
        self._mem: HistoryMemory | None = None
        self._keys: tuple[str, str] | None = None
        self.keys: list[str] | None = None
        self.batch_size = 0

    def __len__(self) -> int:
        return 0 if self._mem is None else len(self._mem)

    def __getitem__(self, idx: int) -> list[dict[str, Any]]:
        if self._mem is None:
            raise IndexError("memory is empty: call reset(batch_size) first")
        return self._mem[idx]

    def reset(self, batch_size: int) -> None:
        if self._mem is None or self._mem.num_envs != batch_size:
            self._mem = HistoryMemory(batch_size, _KeysNotYetKnown())
            if self._keys is not None:
                self._use_keys(*self._keys)
        else:
            self._mem.reset()
        self.batch_size = batch_size
        self.keys = None

    def store(self, record: dict[str, list[Any]]) -> None:
        if self._mem is None:
            raise RuntimeError("call reset(batch_size) before store(record)")
        if self.keys is None:
            self.keys = list(record.keys())
        elif set(self.keys) != set(record):
            raise ValueError(
                f"record keys {list(record)} differ from the batch's {self.keys}: "
                f"missing {sorted(set(self.keys) - set(record))}, "
                f"unexpected {sorted(set(record) - set(self.keys))}"
            )
        if self._keys is None and {"text_obs", "action"} <= set(record):
            # Render with verl's default keys from the first step; fetch re-renders on other keys.
            self._use_keys("text_obs", "action")
        self._mem.store(record)

    def _use_keys(self, obs_key: str, action_key: str) -> None:
        assert self._mem is not None
        self._mem.set_formatter(
            {"name": self._formatter_name, "obs_key": obs_key, "action_key": action_key}
        )
        self._keys = (obs_key, action_key)

    def _fetch(self, history_length: int, obs_key: str, action_key: str):
        if self._mem is None:
            raise RuntimeError("call reset(batch_size) before fetch(...)")
        if history_length < 0:
            raise ValueError(
                "history_length must be >= 0 (0 = every step, as in verl-agent), "
                f"got {history_length}"
            )
        if self._keys != (obs_key, action_key):
            self._use_keys(obs_key, action_key)
        contexts, lengths = self._mem.fetch(history_length or -1)
        return list(contexts), list(lengths)


class SimpleMemory(_VerlMemory):
    """verl-agent's ``SimpleMemory``: ``[Observation k: 'obs', Action k: 'act']`` lines."""

    _formatter_name = "simple"

    def fetch(
        self, history_length: int, obs_key: str = "text_obs", action_key: str = "action"
    ) -> tuple[list[str], list[int]]:
        """Last ``history_length`` steps per env (0 = all) and the number of steps in each."""
        return self._fetch(history_length, obs_key, action_key)


class SearchMemory(_VerlMemory):
    """verl-agent's ``SearchMemory``: ``Step k:act obs`` lines (keys have no defaults, as there)."""

    _formatter_name = "search"

    def fetch(
        self, history_length: int, obs_key: str, action_key: str
    ) -> tuple[list[str], list[int]]:
        """Last ``history_length`` steps per env (0 = all) and the number of steps in each."""
        return self._fetch(history_length, obs_key, action_key)
