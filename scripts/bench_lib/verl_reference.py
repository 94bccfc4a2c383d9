"""verl-agent's ``SimpleMemory`` / ``SearchMemory`` algorithms as they ship, for comparison only.

A copy of verl-agent's ``agent_system/memory/memory.py`` (github.com/langfengQ/verl-agent)
that the byte-identity tests of :mod:`agent_memory.compat.verl` and ``scripts/bench_memory.py``
compare against: store appends a dict per env, fetch re-formats the window on every call.
Use :mod:`agent_memory.compat.verl` in code; this module exists so that both comparisons use
one faithful reference.

Example:
    >>> ref = ReferenceSearchMemory()
    >>> ref.reset(1)
    >>> ref.store({"search": ["q"], "information": ["i"]})
    >>> ref.fetch(3, obs_key="information", action_key="search")
    (['Step 1:q i\\n'], [1])
"""

from __future__ import annotations

from typing import Any

__all__ = ["ReferenceSearchMemory", "ReferenceSimpleMemory"]


class ReferenceSimpleMemory:
    """verl-agent's ``SimpleMemory``, algorithm verbatim."""

    def _line(self, step_num: int, obs: Any, act: Any) -> str:
        return f"[Observation {step_num}: '{obs}', Action {step_num}: '{act}']"

    def __init__(self) -> None:
        self._data: list[list[dict[str, Any]]] | None = None
        self.keys: list[str] | None = None
        self.batch_size = 0

    def __len__(self) -> int:
        return len(self._data or [])

    def __getitem__(self, idx: int) -> list[dict[str, Any]]:
        assert self._data is not None
        return self._data[idx]

    def reset(self, batch_size: int) -> None:
        if self._data is not None:
            self._data.clear()
        self._data = [[] for _ in range(batch_size)]
        self.batch_size = batch_size
        self.keys = None

    def store(self, record: dict[str, list[Any]]) -> None:
        if self.keys is None:
            self.keys = list(record.keys())
        assert self.keys == list(record.keys())
        assert self._data is not None
        for env_idx in range(self.batch_size):
            self._data[env_idx].append({k: record[k][env_idx] for k in self.keys})

    def fetch(
        self, history_length: int, obs_key: str = "text_obs", action_key: str = "action"
    ) -> tuple[list[str], list[int]]:
        assert self._data is not None
        memory_contexts, valid_lengths = [], []
        for env_idx in range(self.batch_size):
            recent = self._data[env_idx][-history_length:]
            valid_len = len(recent)
            start_idx = len(self._data[env_idx]) - valid_len
            lines = []
            for j, rec in enumerate(recent):
                step_num = start_idx + j + 1
                act = rec[action_key]
                obs = rec[obs_key]
                lines.append(self._line(step_num, obs, act))
            memory_contexts.append("\n".join(lines))
            valid_lengths.append(valid_len)
        return memory_contexts, valid_lengths


class ReferenceSearchMemory(ReferenceSimpleMemory):
    """verl-agent's ``SearchMemory``: the same algorithm, ``Step k:act obs\\n`` lines."""

    def _line(self, step_num: int, obs: Any, act: Any) -> str:
        return f"Step {step_num}:{act} {obs}\n"
