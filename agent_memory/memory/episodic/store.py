"""``EpisodeStore``: the SQLite table behind the ``episodic`` memory strategy.

One table of finished episodes' digests (``kind="episode"``) and agents' notes
(``kind="note"``), each with its task key, outcome and the namespace / run / session that wrote
it. A :class:`Scope` says which rows a memory sees and owns: one run id's (``single_run``), one
session id's (``session``) or the namespace's (``persistent``).

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "episodes.sqlite")
    >>> store = EpisodeStore(path)
    >>> scope = Scope("persistent", namespace="demo", run_id="run-1")
    >>> ids = store.add(scope, [MemoryRow("episode", "lake|ab12", "Cross the lake.",
    ...                                   "Actions (2): right; down", won=True, ret=1.0, length=2)])
    >>> [(r.task, r.won, r.length) for r in store.best(scope, "lake|ab12", limit=3)]
    [('Cross the lake.', True, 2)]
    >>> store.count(scope), store.integrity_check()
    (1, 'ok')
    >>> store.close()
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agent_memory.checks import check_choice, check_str
from agent_memory.memory.sqlite import SQLiteDatabase, StoreBusyError, Synchronous
from agent_memory.text import utf8_safe

__all__ = ["RETENTIONS", "EpisodeStore", "MemoryRow", "Retention", "Scope", "StoreBusyError"]

Retention = Literal["single_run", "session", "persistent"]
RETENTIONS: tuple[str, ...] = ("single_run", "session", "persistent")
Kind = Literal["episode", "note"]

_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT    NOT NULL CHECK (kind IN ('episode', 'note')),
    retention   TEXT    NOT NULL CHECK (retention IN ('single_run', 'session', 'persistent')),
    namespace   TEXT    NOT NULL,
    run_id      TEXT    NOT NULL,
    session_id  TEXT,
    task_key    TEXT    NOT NULL,
    task        TEXT    NOT NULL,
    env_name    TEXT,
    episode_uid TEXT,
    won         INTEGER,
    ret         REAL,
    length      INTEGER,
    terminated  INTEGER,
    truncated   INTEGER,
    text        TEXT    NOT NULL,
    started_at  REAL,
    created_at  REAL    NOT NULL,
    writer      TEXT
);
CREATE INDEX IF NOT EXISTS memories_task ON memories (namespace, task_key, kind);
CREATE INDEX IF NOT EXISTS memories_run ON memories (run_id);
CREATE INDEX IF NOT EXISTS memories_session ON memories (session_id);
CREATE INDEX IF NOT EXISTS memories_scope ON memories (retention, namespace);
CREATE INDEX IF NOT EXISTS memories_age ON memories (retention, namespace, created_at);
CREATE INDEX IF NOT EXISTS memories_episode ON memories (episode_uid);
"""
_COLUMNS = (
    "id, kind, task_key, task, text, won, ret, length, terminated, truncated, episode_uid, "
    "env_name, started_at, created_at, retention, namespace, run_id, session_id, writer"
)
# Best first: won, then unknown outcome, then lost; higher return; shorter; newer.
_RANK = (
    "CASE WHEN won = 1 THEN 0 WHEN won IS NULL THEN 1 ELSE 2 END, "
    "COALESCE(ret, -1e308) DESC, COALESCE(length, 1e9) ASC, id DESC"
)
_PRUNE_TASK = (
    "DELETE FROM memories WHERE id IN (SELECT id FROM memories WHERE {where} AND task_key = ? "
    "AND kind = 'episode' ORDER BY " + _RANK + " LIMIT -1 OFFSET ?)"
)


@dataclass(frozen=True)
class Scope:
    """Which rows a memory sees and owns (see the module docstring).

    Args:
        retention: ``single_run``, ``session`` or ``persistent``.
        namespace: separates experiments sharing one database file.
        run_id: the run that writes (every row records it).
        session_id: the session (``retention="session"`` needs one).
    """

    retention: Retention
    namespace: str = "default"
    run_id: str = ""
    session_id: str | None = None

    def __post_init__(self) -> None:
        check_choice("retention", self.retention, RETENTIONS)
        check_str("namespace", self.namespace)
        check_str("run_id", self.run_id)
        if self.retention == "session" and not self.session_id:
            raise ValueError(
                "retention='session' needs a session_id (shared by the runs of the session), "
                f"got {self.session_id!r}"
            )

    def where(self) -> tuple[str, tuple[Any, ...]]:
        """The SQL condition selecting this scope's rows, and its parameters."""
        where = f"retention = '{self.retention}' AND namespace = ?"
        column = {"single_run": "run_id", "session": "session_id"}.get(self.retention)
        if column is None:
            return where, (self.namespace,)
        return f"{where} AND {column} = ?", (self.namespace, getattr(self, column))


@dataclass(frozen=True)
class MemoryRow:
    """One memory: an episode digest or a note. ``id`` and the scope fields are set by the store."""

    kind: Kind
    task_key: str
    task: str
    text: str
    won: bool | None = None
    ret: float | None = None
    length: int | None = None
    terminated: bool | None = None
    truncated: bool | None = None
    episode_uid: str | None = None
    env_name: str | None = None
    started_at: float | None = None
    created_at: float = 0.0
    id: int | None = None
    retention: str | None = None
    namespace: str | None = None
    run_id: str | None = None
    session_id: str | None = None
    writer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def _bool(v: Any) -> bool | None:
    return None if v is None else bool(v)


def _int(v: bool | None) -> int | None:
    return None if v is None else int(v)


def _row(t: Sequence[Any]) -> MemoryRow:
    return MemoryRow(
        id=t[0],
        kind=t[1],
        task_key=t[2],
        task=t[3],
        text=t[4],
        won=_bool(t[5]),
        ret=t[6],
        length=t[7],
        terminated=_bool(t[8]),
        truncated=_bool(t[9]),
        episode_uid=t[10],
        env_name=t[11],
        started_at=t[12],
        created_at=t[13],
        retention=t[14],
        namespace=t[15],
        run_id=t[16],
        session_id=t[17],
        writer=t[18],
    )


class EpisodeStore:
    """A SQLite (WAL) store of episode digests and notes, safe for concurrent processes.

    Args:
        path: the database file (created with its directory; ``":memory:"``: private).
        busy_timeout_s, max_wait_s, synchronous: as for
            :class:`~agent_memory.memory.sqlite.SQLiteDatabase`.

    Raises:
        ValueError: bad arguments, or a database written by a newer schema.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout_s: float = 5.0,
        max_wait_s: float = 60.0,
        synchronous: Synchronous = "NORMAL",
    ) -> None:
        self.db = SQLiteDatabase(
            path,
            schema=_SCHEMA,
            schema_version=_SCHEMA_VERSION,
            busy_timeout_s=busy_timeout_s,
            max_wait_s=max_wait_s,
            synchronous=synchronous,
        )

    @property
    def path(self) -> str:
        """The database file (``":memory:"``: a private in-process database)."""
        return self.db.path

    @property
    def busy_timeout_s(self) -> float:
        return self.db.busy_timeout_s

    @property
    def synchronous(self) -> str:
        return self.db.synchronous

    @property
    def retries(self) -> int:
        """Lock waits that went past SQLite's busy handler and were retried (this process)."""
        return self.db.retries

    @property
    def _writer(self) -> str:
        # Who wrote a row (this process: it changes across a fork).
        return f"{socket.gethostname()}:{os.getpid()}"

    def close(self) -> None:
        """Close this process's connection (the database stays on disk)."""
        self.db.close()

    @property
    def closed(self) -> bool:
        return self.db.closed

    def add(
        self, scope: Scope, rows: Iterable[MemoryRow], *, keep_per_task: int | None = None
    ) -> list[int]:
        """Insert ``rows`` under ``scope`` in one transaction (pruned per ``keep_per_task``)."""
        rows = list(rows)
        now = time.time()
        sid = scope.session_id
        where, params = scope.where()
        writer = self._writer

        def insert(c: sqlite3.Connection) -> list[int]:
            ids = []
            for r in rows:
                cur = c.execute(
                    "INSERT INTO memories (kind, retention, namespace, run_id, session_id, "
                    "task_key, task, env_name, episode_uid, won, ret, length, terminated, "
                    "truncated, text, started_at, created_at, writer) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        r.kind,
                        scope.retention,
                        scope.namespace,
                        scope.run_id,
                        sid,
                        r.task_key,
                        utf8_safe(r.task),
                        r.env_name,
                        r.episode_uid,
                        _int(r.won),
                        r.ret,
                        r.length,
                        _int(r.terminated),
                        _int(r.truncated),
                        utf8_safe(r.text),  # SQLite takes UTF-8 only
                        r.started_at,
                        r.created_at or now,
                        writer,
                    ),
                )
                assert cur.lastrowid is not None  # set by every INSERT
                ids.append(cur.lastrowid)
            if keep_per_task is not None:
                for key in dict.fromkeys(r.task_key for r in rows if r.kind == "episode"):
                    c.execute(_PRUNE_TASK.format(where=where), (*params, key, keep_per_task))
            return ids

        return self.db.write(insert)

    def set_outcome(
        self,
        scope: Scope,
        episode_uid: str,
        *,
        won: bool | None,
        ret: float | None,
        length: int | None,
    ) -> int:
        """Fill in the outcome of the notes written during episode ``episode_uid``."""
        where, params = scope.where()
        sql = (
            f"UPDATE memories SET won = ?, ret = ?, length = ? WHERE {where} AND kind = 'note' "
            "AND episode_uid = ?"
        )
        values = (_int(won), ret, length, *params, episode_uid)
        return self.db.write(lambda c: c.execute(sql, values).rowcount)

    def delete_scope(self, scope: Scope) -> int:
        """Delete every row of ``scope`` (a run's rows, or a session's); returns how many."""
        where, params = scope.where()
        sql = f"DELETE FROM memories WHERE {where}"
        return self.db.write(lambda c: c.execute(sql, params).rowcount)

    def expire_sessions(self, namespace: str, ttl_s: float, now: float | None = None) -> int:
        """Delete the session rows of sessions idle (no new row) for more than ``ttl_s``."""
        cutoff = (time.time() if now is None else now) - ttl_s
        sql = (
            "DELETE FROM memories WHERE retention = 'session' AND namespace = ? AND session_id IN "
            "(SELECT session_id FROM memories WHERE retention = 'session' AND namespace = ? "
            "GROUP BY session_id HAVING MAX(created_at) < ?)"
        )
        return self.db.write(lambda c: c.execute(sql, (namespace, namespace, cutoff)).rowcount)

    def prune(
        self,
        retention: Retention,
        namespace: str,
        *,
        max_age_s: float | None = None,
        max_rows: int | None = None,
        now: float | None = None,
    ) -> int:
        """Delete ``namespace``'s ``retention`` rows past ``max_age_s`` or ``max_rows``; count."""

        def run(c: sqlite3.Connection) -> int:
            n = 0
            if max_age_s is not None:
                cutoff = (time.time() if now is None else now) - max_age_s
                n += c.execute(
                    "DELETE FROM memories WHERE retention = ? AND namespace = ? AND created_at < ?",
                    (retention, namespace, cutoff),
                ).rowcount
            if max_rows is not None:
                n += c.execute(
                    "DELETE FROM memories WHERE id IN (SELECT id FROM memories WHERE "
                    "retention = ? AND namespace = ? ORDER BY id DESC LIMIT -1 OFFSET ?)",
                    (retention, namespace, max_rows),
                ).rowcount
            return n

        return self.db.write(run)

    def prune_task(self, scope: Scope, task_key: str, keep: int) -> int:
        """Keep only the best ``keep`` episodes of ``task_key`` in ``scope``; returns deletions."""
        where, params = scope.where()
        return self.db.write(
            lambda c: c.execute(_PRUNE_TASK.format(where=where), (*params, task_key, keep)).rowcount
        )

    def best(
        self,
        scope: Scope,
        task_key: str,
        *,
        limit: int,
        kinds: Sequence[Kind] = ("episode",),
        include_failures: bool = True,
        order: Literal["best", "recent"] = "best",
    ) -> list[MemoryRow]:
        """The rows of ``task_key`` in ``scope``, best (won, return, length, id) or newest first."""
        where, params = scope.where()
        kind_sql = ", ".join("?" * len(kinds))
        won_sql = "" if include_failures else " AND won = 1"
        rank = _RANK if order == "best" else "id DESC"
        rows = self.db.read(
            f"SELECT {_COLUMNS} FROM memories WHERE {where} AND task_key = ? AND kind IN "
            f"({kind_sql}){won_sql} ORDER BY {rank} LIMIT ?",
            (*params, task_key, *kinds, limit),
        )
        return [_row(t) for t in rows]

    def recent(
        self, scope: Scope, *, limit: int, kinds: Sequence[Kind] = ("episode", "note")
    ) -> list[MemoryRow]:
        """The newest ``limit`` rows of ``scope``."""
        where, params = scope.where()
        kind_sql = ", ".join("?" * len(kinds))
        rows = self.db.read(
            f"SELECT {_COLUMNS} FROM memories WHERE {where} AND kind IN ({kind_sql}) "
            "ORDER BY id DESC LIMIT ?",
            (*params, *kinds, limit),
        )
        return [_row(t) for t in rows]

    def tasks_since(self, scope: Scope, after_id: int) -> list[tuple[int, str, str]]:
        """``(newest id, task_key, task)`` of each task key with rows newer than ``after_id``."""
        where, params = scope.where()
        return [
            (int(i), k, t)
            for i, k, t in self.db.read(
                f"SELECT MAX(id), task_key, task FROM memories WHERE {where} AND id > ? "
                "GROUP BY task_key",
                (*params, after_id),
            )
        ]

    def rows(self, scope: Scope | None = None) -> list[MemoryRow]:
        """Every row of ``scope`` (all rows when None), oldest first."""
        where, params = ("1", ()) if scope is None else scope.where()
        sql = f"SELECT {_COLUMNS} FROM memories WHERE {where} ORDER BY id"
        return [_row(t) for t in self.db.read(sql, params)]

    def count(self, scope: Scope | None = None) -> int:
        """Rows in ``scope`` (all rows when None)."""
        where, params = ("1", ()) if scope is None else scope.where()
        return int(self.db.read(f"SELECT COUNT(*) FROM memories WHERE {where}", params)[0][0])

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` (``"ok"`` when sound)."""
        return self.db.integrity_check()

    def __repr__(self) -> str:
        return f"EpisodeStore({self.path!r}, synchronous={self.synchronous!r})"
