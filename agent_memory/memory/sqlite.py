"""One SQLite database shared by the processes of one host: the storage layer under the episodic
memory's episode store and the blackboard's notes.

One lazily opened connection per process (instances pickle without it), WAL journal (a local
file system), each write one ``BEGIN IMMEDIATE`` transaction retried while the database stays
locked: a writer killed with SIGKILL loses at most its open transaction.

Example:
    >>> db = SQLiteDatabase(None, schema="CREATE TABLE IF NOT EXISTS kv (k TEXT, v TEXT)")
    >>> db.write(lambda c: c.execute("INSERT INTO kv VALUES ('a', '1')").rowcount)
    1
    >>> db.read("SELECT k, v FROM kv"), db.integrity_check()
    ([('a', '1')], 'ok')
    >>> db.close()
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from agent_memory.checks import check_int, check_number

__all__ = ["SYNCHRONOUS", "SQLiteDatabase", "StoreBusyError", "Synchronous", "check_sqlite_options"]

T = TypeVar("T")
Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
SYNCHRONOUS: tuple[str, ...] = ("OFF", "NORMAL", "FULL", "EXTRA")
_TABLE = re.compile(r"CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+(\w+)", re.IGNORECASE)
#: First and largest pause between retries of a locked database (seconds, before jitter).
_FIRST_DELAY, _MAX_DELAY = 0.002, 0.1


class StoreBusyError(sqlite3.OperationalError):
    """The database stayed locked by other writers for longer than ``max_wait_s``."""


def check_sqlite_options(busy_timeout_s: Any, max_wait_s: Any, synchronous: Any) -> None:
    """Validate the SQLite settings of :class:`SQLiteDatabase`.

    Example:
        >>> check_sqlite_options(5.0, 60.0, "SLOW")
        Traceback (most recent call last):
        ...
        ValueError: synchronous must be one of ['OFF', 'NORMAL', 'FULL', 'EXTRA'], got 'SLOW'
    """
    check_number("busy_timeout_s", busy_timeout_s, low=0)
    check_number("max_wait_s", max_wait_s, low=0)
    if not isinstance(synchronous, str) or synchronous.upper() not in SYNCHRONOUS:
        raise ValueError(f"synchronous must be one of {list(SYNCHRONOUS)}, got {synchronous!r}")


def _is_busy(e: sqlite3.OperationalError) -> bool:
    msg = str(e).lower()
    return "locked" in msg or "busy" in msg


class SQLiteDatabase:
    """A SQLite file shared by processes (see the module docstring).

    Args:
        path: the database file (created with its directory); None or ``":memory:"``: private.
        schema: ``CREATE ... IF NOT EXISTS`` statements separated by ``;``.
        schema_version: ``PRAGMA user_version`` once the schema exists (higher ones refused).
        busy_timeout_s: how long SQLite's busy handler waits for a lock per attempt.
        max_wait_s: total time a write (or read) retries a locked database (then it raises).
        synchronous: SQLite's pragma (``NORMAL`` survives process kills, ``FULL`` power loss).

    Raises:
        ValueError: a bad setting, or a database written by a newer schema.
        sqlite3.OperationalError: the file system refused WAL mode.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        schema: str,
        schema_version: int = 1,
        busy_timeout_s: float = 5.0,
        max_wait_s: float = 60.0,
        synchronous: Synchronous = "NORMAL",
    ) -> None:
        check_sqlite_options(busy_timeout_s, max_wait_s, synchronous)
        self.path = ":memory:" if path is None else str(Path(path).expanduser())
        self.schema = schema
        self.schema_version = check_int("schema_version", schema_version, 1)
        self.busy_timeout_s = float(busy_timeout_s)
        self.max_wait_s = float(max_wait_s)
        self.synchronous = str(synchronous).upper()
        #: Lock waits that went past SQLite's busy handler and were retried (this process).
        self.retries = 0
        #: Transactions this instance committed (with :meth:`changes`: when a cache is stale).
        self.commits = 0
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._generation = 0  # connections opened so far (each new one restarts data_version)
        self._inherited: list[sqlite3.Connection] = []
        self.connection()

    @property
    def private(self) -> bool:
        """An in-process database (``path`` None or ``":memory:"``)."""
        return self.path == ":memory:"

    def connection(self) -> sqlite3.Connection:
        """This process's connection (opened, and the schema checked, on first use)."""
        conn = self._conn
        if conn is not None and self._pid == os.getpid():
            return conn
        with self._lock:
            if self._conn is not None and self._pid != os.getpid():
                # Opened before a fork: never touched in this process, only kept referenced.
                self._inherited.append(self._conn)
            if not self.private:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            self._conn, self._pid = conn, os.getpid()
            self._generation += 1
            self._retry(lambda: self._configure(conn))
            self._ensure_schema(conn)
            return conn

    def _configure(self, conn: sqlite3.Connection) -> None:
        if not self.private:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(
                    f"SQLite refused WAL mode for {self.path!r} (journal_mode={mode!r}): put the "
                    "database on a local file system of the workers' host (WAL needs shared "
                    "memory, which network file systems lack)"
                )
        conn.execute(f"PRAGMA synchronous={self.synchronous}")

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        version = self._retry(lambda: conn.execute("PRAGMA user_version").fetchone()[0])
        if version > self.schema_version:
            raise ValueError(
                f"{self.path} holds schema version {version}, this code reads up to "
                f"{self.schema_version}: upgrade agent_memory or use another path"
            )
        tables = _TABLE.findall(self.schema)
        if version == self.schema_version and tables:
            marks = ", ".join("?" * len(tables))
            sql = f"SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ({marks})"
            if self._retry(lambda: conn.execute(sql, tables).fetchone()[0]) == len(tables):
                return

        def create(c: sqlite3.Connection) -> None:
            # Statement by statement: executescript() would COMMIT the open transaction.
            for stmt in filter(None, (s.strip() for s in self.schema.split(";"))):
                c.execute(stmt)
            if c.execute("PRAGMA user_version").fetchone()[0] < self.schema_version:
                c.execute(f"PRAGMA user_version={self.schema_version}")

        self.write(create)

    def close(self) -> None:
        """Close this process's connection (the database stays on disk)."""
        with self._lock:
            if self._conn is not None and self._pid == os.getpid():
                self._conn.close()
            self._conn = None

    @property
    def closed(self) -> bool:
        """No open connection (in this process)."""
        return self._conn is None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_conn=None, _pid=-1, _inherited=[], _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()
        self.connection()

    def _retry(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried with jittered backoff while the database is locked."""
        deadline = time.monotonic() + self.max_wait_s
        delay = _FIRST_DELAY
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as e:
                if not _is_busy(e) or isinstance(e, StoreBusyError):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreBusyError(
                        f"{self.path} stayed locked for more than max_wait_s={self.max_wait_s} s "
                        f"({e}); raise max_wait_s or reduce concurrent writers"
                    ) from e
                self.retries += 1
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, _MAX_DELAY)

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` in one ``BEGIN IMMEDIATE`` transaction (rolled back when it raises),
        retried while the database is locked.

        Raises:
            StoreBusyError: still locked after ``max_wait_s``.
        """
        with self._lock:
            conn = self.connection()

            def attempt() -> T:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return out

            out = self._retry(attempt)
            self.commits += 1
            return out

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one query, retried while the database is locked."""
        with self._lock:
            conn = self.connection()
            return self._retry(lambda: conn.execute(sql, tuple(params)).fetchall())

    def changes(self) -> tuple[int, int, int]:
        """A value that differs whenever the database may have changed since it was last read."""
        version = self.read("PRAGMA data_version")[0][0]
        return self._generation, int(version), self.commits

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` (``"ok"`` when sound)."""
        return "\n".join(str(r[0]) for r in self.read("PRAGMA integrity_check"))

    def __repr__(self) -> str:
        return f"SQLiteDatabase({self.path!r}, synchronous={self.synchronous!r})"
