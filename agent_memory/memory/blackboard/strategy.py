"""``BlackboardMemory``: each env's recent window plus notes shared across envs and processes.

Notes go to an append-only SQLite board at ``path``, shared by every worker on the host that
opens it. An env sees its group's notes (``scope="group"``, see
:meth:`BlackboardMemory.set_groups`) or all (``"global"``): the newest ``top_n``, before its
window. Episode digests are posted at an episode's end (every action too with ``post_actions``).

Example:
    >>> mem = BlackboardMemory(num_envs=2, top_n=2)  # path=None: a private in-memory board
    >>> mem.set_groups([0, 1], ["task-7", "task-7"])
    >>> mem.post(1, "the key is under the mat", step=4)
    >>> mem.store({"observation": ["a locked door"], "action": ["look"]}, env_ids=[0])
    >>> print(mem.fetch(3, env_ids=[0]).contexts[0])
    Shared notes (newest first):
    - [env 1, step 4] the key is under the mat
    Recent steps:
    [Observation 1: 'a locked door', Action 1: 'look']
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from agent_memory.formatting import FormatterSpec
from agent_memory.memory.base import (
    UNSET,
    Budget,
    EnvIds,
    Fetched,
    check_env_index,
    normalize_env_ids,
)
from agent_memory.memory.blackboard.board import SQLiteBoard
from agent_memory.memory.blackboard.settings import BlackboardSettings
from agent_memory.memory.block_window import Block, BlockLayout, WindowedMemory
from agent_memory.memory.digest import episode_digest
from agent_memory.memory.settings import SettingsAttributes
from agent_memory.text import squash, utf8_safe
from agent_memory.tokens import TokenCounterSpec

__all__ = ["BlackboardMemory"]


class BlackboardMemory(SettingsAttributes[BlackboardSettings], WindowedMemory):
    """Per-env recent window + the newest notes of a board shared across envs and processes.

    Args:
        num_envs, formatter, max_history_tokens, token_counter, capacity: as for HistoryMemory (a
            budget covers notes and window, the window first).
        **settings: the fields of :class:`BlackboardSettings`, each documented there.

    Raises:
        ValueError: a bad setting.
    """

    settings_class = BlackboardSettings

    #: The context can show notes before any step is stored.
    fetch_when_empty: ClassVar[bool] = True

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "simple",
        *,
        max_history_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(**self._shared(locals()))
        self.settings = s = BlackboardSettings(**settings)
        self.layout = BlockLayout(header=s.header, window_header=s.window_header)
        self.board = SQLiteBoard(s.path, timeout=s.timeout)
        self.groups: list[str] = ["default"] * num_envs
        # Per group (None: the whole board): the block of its newest notes, until the board
        # changes (``_cache_key``) or the oldest cached note expires (``_cache_until``).
        self._cache: dict[str | None, Block | None] = {}
        self._cache_key: tuple[int, int, int] | None = None
        self._cache_until = float("inf")

    @property
    def path(self) -> str | None:
        """The board's SQLite file (None: a private in-memory board)."""
        return None if self.settings.path is None else os.fspath(self.settings.path)

    @property
    def board_name(self) -> str:
        """The board's name in the file."""
        return self.settings.board

    def set_groups(self, env_ids: EnvIds, group_ids: Sequence[Any]) -> None:
        """Put each env of ``env_ids`` in the group of the same position in ``group_ids``
        (compared as strings across processes: use ids that mean the same in every worker)."""
        ids = self._ids(env_ids)
        if isinstance(group_ids, (str, bytes)) or len(group_ids) != len(ids):
            got = "a str" if isinstance(group_ids, (str, bytes)) else f"{len(group_ids)} values"
            raise ValueError(f"group_ids must hold one id per env ({len(ids)}), got {got}")
        for i, g in zip(ids, group_ids, strict=True):
            self.groups[i] = str(g)

    def post(self, env_id: int, text: str, step: int | None = None) -> None:
        """Post one note by env ``env_id`` to its group (``step`` defaults to its current one)."""
        self.post_many([env_id], [text], None if step is None else [step])

    def post_many(
        self,
        env_ids: Sequence[int],
        texts: Sequence[str],
        steps: Sequence[int | None] | None = None,
    ) -> None:
        """Post one note per env of ``env_ids`` in one transaction."""
        ids = normalize_env_ids(env_ids, self.num_envs)
        if isinstance(texts, (str, bytes)) or len(texts) != len(ids):
            raise ValueError(f"texts must hold one note per env ({len(ids)}), got {texts!r:.60}")
        if steps is None:
            steps = [self._window.num_steps(i) for i in ids]
        s = self.settings
        assert s.author is not None  # set by BlackboardSettings.__post_init__
        now = float(s.clock())
        cap = s.note_chars
        rows = [
            (
                self.groups[i],
                s.author,
                i,
                None if step is None else int(step),
                now,
                t if len(t := utf8_safe(squash(str(x), cap + 1))) <= cap else t[: cap - 3] + "...",
            )
            for i, x, step in zip(ids, texts, steps, strict=True)
        ]
        self.board.post(s.board, rows, max_notes=s.max_notes, max_age=s.max_age_seconds, now=now)

    def on_episode_end(self, env_id: int, episode: Mapping[str, Any]) -> None:
        """Post the digest of env ``env_id``'s finished episode (at most ``digest_chars``)."""
        cap = self.settings.digest_chars
        digest = episode_digest(episode, max_chars=cap, outcome=True, sep=" | ")
        self.post(env_id, digest, step=episode.get("num_steps"))

    def notes(self, env_id: int) -> list[dict[str, Any]]:
        """The notes env ``env_id`` would see (newest first, at most ``top_n``)."""
        i = check_env_index(env_id, self.num_envs)
        key = self._group_key(i)
        s = self.settings
        groups = None if key is None else [key]
        return self.board.recent(s.board, groups, s.top_n, self._min_ts())[key]

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Append one step per env (as HistoryMemory); with ``post_actions`` post the actions."""
        ids = self._ids(env_ids)
        self._window.store(record, ids)
        if self.settings.post_actions and ids:
            acts = record.get("action")
            if acts is not None:
                self.post_many(ids, [str(a) for a in acts])

    def fetch(
        self, history_length: int, env_ids: EnvIds = None, *, max_history_tokens: Budget = UNSET
    ) -> Fetched:
        """Each env's context: its group's (or the board's) newest notes, then its window.

        Notes are read with one query per fetch, and not at all while the board is unchanged.
        """
        hl, ids, budgets = self._request(history_length, env_ids, max_history_tokens)
        if not self.settings.top_n:
            return self._window.fetch(hl, ids, max_history_tokens=budgets)
        visible = self._visible(ids)
        blocks = [visible[self._group_key(i)] for i in ids]
        return self.layout.fetch(self._window, hl, ids, budgets, blocks)[0]

    def config(self) -> dict[str, Any]:
        """The blackboard settings (JSON-able), as in :meth:`state_dict`."""
        config = self.settings.to_dict()
        del config["clock"], config["timeout"]
        return config

    def state_dict(self) -> dict[str, Any]:
        """Windows, groups and settings; the notes too when the board is private (no path)."""
        return {
            **self._state_header(),
            "config": self.config(),
            "groups": list(self.groups),
            "window": self._window.state_dict(),
            "notes": self.board.dump(self.board_name) if self.path is None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (a private board gets the saved notes back).

        Raises:
            ValueError: a state of another kind, version or number of envs.
        """
        self._check_state(state)
        self._window.load_state_dict(state["window"])
        self.groups = [str(g) for g in state["groups"]]
        if self.path is None and state.get("notes") is not None:
            self.board.replace(self.board_name, state["notes"])
        self._cache_key = None

    def close(self) -> None:
        """Close the database connection."""
        self.board.close()

    def _group_key(self, i: int) -> str | None:
        """Whose notes env ``i`` sees: its group's, or the whole board's (None)."""
        return None if self.settings.scope == "global" else self.groups[i]

    def _min_ts(self) -> float | None:
        age = self.settings.max_age_seconds
        return None if age is None else float(self.settings.clock()) - age

    def _visible(self, ids: list[int]) -> dict[str | None, Block | None]:
        """The block of newest notes per group of ``ids`` (None: global), cached."""
        s = self.settings
        key = self.board.version()
        now = float(s.clock())
        if key != self._cache_key or now >= self._cache_until:
            self._cache, self._cache_key, self._cache_until = {}, key, float("inf")
        todo = [g for g in dict.fromkeys(self._group_key(i) for i in ids) if g not in self._cache]
        if todo:
            groups = None if s.scope == "global" else [g for g in todo if g is not None]
            found = self.board.recent(s.board, groups, s.top_n, self._min_ts())
            counter = self.token_counter
            for g, notes in found.items():
                lines = [
                    s.note_format.format(
                        text=n["text"],
                        env_id=n["env_id"],
                        step=n["step"],
                        group=n["group_id"],
                        author=n["author"],
                    )
                    for n in notes
                ]
                costs = counter.count_many([line + "\n" for line in lines])
                self._cache[g] = Block(lines, costs) if lines else None
                if s.max_age_seconds is not None and notes:
                    oldest = min(n["ts"] for n in notes)
                    self._cache_until = min(self._cache_until, oldest + s.max_age_seconds)
        return self._cache

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"BlackboardMemory(num_envs={self.num_envs}, path={s.path!r}, board={s.board!r}, "
            f"scope={s.scope!r}, top_n={s.top_n}, max_notes={s.max_notes}, "
            f"max_age_seconds={s.max_age_seconds})"
        )
