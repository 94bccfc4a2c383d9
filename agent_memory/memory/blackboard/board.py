"""``SQLiteBoard``: an append-only table of notes in one SQLite database, shared across processes.

The storage of :class:`~agent_memory.memory.blackboard.BlackboardMemory`, on
:class:`~agent_memory.memory.sqlite.SQLiteDatabase`: concurrent writers lose no note.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from agent_memory.memory.sqlite import SQLiteDatabase

__all__ = ["SQLiteBoard"]

_FIELDS = ("id", "group_id", "author", "env_id", "step", "ts", "text")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    board TEXT NOT NULL,
    group_id TEXT NOT NULL,
    author TEXT NOT NULL,
    env_id INTEGER NOT NULL,
    step INTEGER,
    ts REAL NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS notes_by_group ON notes (board, group_id, id);
"""


class SQLiteBoard:
    """The notes table of one SQLite database, shared by every process that opens it.

    Args:
        path: database file (created with its directory); None: a private in-memory database.
        timeout: seconds a writer waits in all for another's lock.

    Example:
        >>> board = SQLiteBoard(None)  # a private in-memory database
        >>> board.post("b", [("g1", "me", 0, 3, 1.0, "the key is under the mat")],
        ...            max_notes=10, max_age=None, now=1.0)
        >>> notes = board.recent("b", ["g1"], 5, None)["g1"]
        >>> [(n["group_id"], n["step"], n["text"]) for n in notes]
        [('g1', 3, 'the key is under the mat')]
        >>> board.close()
    """

    def __init__(self, path: str | os.PathLike[str] | None, timeout: float = 30.0) -> None:
        self.db = SQLiteDatabase(
            path, schema=_SCHEMA, busy_timeout_s=min(5.0, timeout), max_wait_s=timeout
        )
        self.path = None if self.db.private else self.db.path

    def version(self) -> tuple[int, int, int]:
        """Differs whenever the notes may have changed (``SQLiteDatabase.changes``)."""
        return self.db.changes()

    def post(
        self,
        board: str,
        rows: Sequence[tuple[str, str, int, int | None, float, str]],
        *,
        max_notes: int | None,
        max_age: float | None,
        now: float,
    ) -> None:
        """Append ``(group_id, author, env_id, step, ts, text)`` rows, then trim the board."""
        if not rows:
            return

        def insert(c: Any) -> None:
            c.executemany(
                "INSERT INTO notes (board, group_id, author, env_id, step, ts, text) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(board, *r) for r in rows],
            )
            if max_notes is not None:
                c.execute(
                    "DELETE FROM notes WHERE board = ? AND id <= (SELECT id FROM notes WHERE "
                    "board = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (board, board, max_notes),
                )
            if max_age is not None:
                c.execute("DELETE FROM notes WHERE board = ? AND ts < ?", (board, now - max_age))

        self.db.write(insert)

    def recent(
        self, board: str, groups: Sequence[str] | None, n: int, min_ts: float | None
    ) -> dict[str | None, list[dict[str, Any]]]:
        """The newest ``n`` notes (newest first) per group in ``groups`` (None: the board's)."""
        cols = ", ".join(_FIELDS)
        age = "" if min_ts is None else " AND ts >= ?"
        age_arg: tuple[Any, ...] = () if min_ts is None else (min_ts,)
        if groups is None:
            rows = self.db.read(
                f"SELECT {cols} FROM notes WHERE board = ?{age} ORDER BY id DESC LIMIT ?",
                (board, *age_arg, n),
            )
            return {None: [dict(zip(_FIELDS, r, strict=True)) for r in rows]}
        out: dict[str | None, list[dict[str, Any]]] = {g: [] for g in groups}
        uniq = list(out)
        for k in range(0, len(uniq), 500):  # stay far below SQLite's bound-parameter limit
            chunk = uniq[k : k + 500]
            marks = ", ".join("?" * len(chunk))
            rows = self.db.read(
                f"SELECT {cols} FROM (SELECT {cols}, ROW_NUMBER() OVER (PARTITION BY group_id "
                f"ORDER BY id DESC) AS r FROM notes WHERE board = ? AND group_id IN ({marks})"
                f"{age}) WHERE r <= ? ORDER BY id DESC",
                (board, *chunk, *age_arg, n),
            )
            for r in rows:
                note = dict(zip(_FIELDS, r, strict=True))
                out[note["group_id"]].append(note)
        return out

    def dump(self, board: str) -> list[dict[str, Any]]:
        """Every note of ``board``, oldest first."""
        rows = self.db.read(
            f"SELECT {', '.join(_FIELDS)} FROM notes WHERE board = ? ORDER BY id", (board,)
        )
        return [dict(zip(_FIELDS, r, strict=True)) for r in rows]

    def replace(self, board: str, notes: Sequence[Mapping[str, Any]]) -> None:
        """Make ``board`` hold exactly ``notes`` (ids kept)."""

        def refill(c: Any) -> None:
            c.execute("DELETE FROM notes WHERE board = ?", (board,))
            c.executemany(
                "INSERT INTO notes (id, board, group_id, author, env_id, step, ts, text) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(n["id"], board, *(n[f] for f in _FIELDS[1:])) for n in notes],
            )

        self.db.write(refill)

    def close(self) -> None:
        """Close the connection."""
        self.db.close()
