"""The one SQLite layer under the episode store and the blackboard: lock retries against another
process, fork safety, pickling, schema creation and versions."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import re
import sqlite3
import time

import pytest

from agent_memory.memory.blackboard import SQLiteBoard
from agent_memory.memory.episodic import EpisodeStore
from agent_memory.memory.sqlite import SQLiteDatabase, StoreBusyError

SCHEMA = "CREATE TABLE IF NOT EXISTS log (who TEXT NOT NULL, n INTEGER NOT NULL)"


def _hold_lock(path: str, held, release, seconds: float) -> None:
    """Another process: take the write lock, hold it ``seconds`` (or until ``release``)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO log VALUES ('holder', 0)")
    held.set()
    release.wait(seconds)
    conn.execute("COMMIT")
    conn.close()


def _holder(path: str, seconds: float):
    ctx = mp.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold_lock, args=(path, held, release, seconds))
    proc.start()
    assert held.wait(60), "the holder process never took the lock"
    return proc, release


def _insert(who: str, n: int):
    return lambda c: c.execute("INSERT INTO log VALUES (?, ?)", (who, n)).rowcount


def test_a_write_waits_for_a_lock_held_shorter_than_max_wait(tmp_path):
    path = str(tmp_path / "db.sqlite")
    db = SQLiteDatabase(path, schema=SCHEMA, busy_timeout_s=0.01, max_wait_s=30)
    proc, _ = _holder(path, seconds=0.5)
    t0 = time.monotonic()
    assert db.write(_insert("writer", 1)) == 1
    waited = time.monotonic() - t0
    proc.join(30)
    assert proc.exitcode == 0
    # The busy handler gave up after 10 ms each time: our retries carried the write through.
    assert waited >= 0.2 and db.retries > 0
    assert db.read("SELECT who FROM log ORDER BY rowid") == [("holder",), ("writer",)]
    db.close()


def test_a_lock_held_past_max_wait_raises_the_documented_error(tmp_path):
    path = str(tmp_path / "db.sqlite")
    db = SQLiteDatabase(path, schema=SCHEMA, busy_timeout_s=0.01, max_wait_s=0.3)
    proc, release = _holder(path, seconds=60)
    try:
        with pytest.raises(
            StoreBusyError,
            match=re.escape(
                f"{path} stayed locked for more than max_wait_s=0.3 s (database is locked); "
                "raise max_wait_s or reduce concurrent writers"
            ),
        ):
            db.write(_insert("writer", 1))
    finally:
        release.set()
        proc.join(30)
    assert db.write(_insert("writer", 2)) == 1  # usable again once the lock is free
    assert db.read("SELECT who, n FROM log ORDER BY rowid") == [("holder", 0), ("writer", 2)]
    db.close()


def _write_in_child(db: SQLiteDatabase, inherited: sqlite3.Connection, out) -> None:
    out.put((db.connection() is not inherited, db.write(_insert("child", 1))))


def test_a_forked_child_opens_its_own_connection(tmp_path):
    db = SQLiteDatabase(tmp_path / "db.sqlite", schema=SCHEMA)
    db.write(_insert("parent", 1))  # the parent's connection is open before the fork
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_write_in_child, args=(db, db.connection(), out))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0 and out.get(timeout=5) == (True, 1)
    db.write(_insert("parent", 2))  # the parent's connection is untouched by the child
    assert db.read("SELECT who, n FROM log ORDER BY rowid") == [
        ("parent", 1),
        ("child", 1),
        ("parent", 2),
    ]
    assert db.integrity_check() == "ok"
    db.close()


def test_pickles_without_its_connection_and_sees_changes(tmp_path):
    db = SQLiteDatabase(tmp_path / "db.sqlite", schema=SCHEMA, busy_timeout_s=0.5)
    clone = pickle.loads(pickle.dumps(db))
    assert clone.busy_timeout_s == 0.5 and clone.connection() is not db.connection()
    before = db.changes()
    clone.write(_insert("clone", 1))  # another connection's commit...
    assert db.changes() != before  # ...is seen
    assert db.read("SELECT who FROM log") == [("clone",)]
    assert db.read("PRAGMA journal_mode") == [("wal",)]
    db.close()
    clone.close()
    assert db.closed and clone.closed


def test_a_missing_table_is_created_even_at_the_current_version(tmp_path):
    """Two stores may share one file: the second one's tables are created too."""
    path = tmp_path / "shared.sqlite"
    EpisodeStore(path).close()
    board = SQLiteBoard(path)
    board.post("b", [("g", "me", 0, 1, 1.0, "a note")], max_notes=None, max_age=None, now=1.0)
    assert [n["text"] for n in board.dump("b")] == ["a note"]
    board.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=7")
    conn.close()
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{path} holds schema version 7, this code reads up to 1: upgrade agent_memory or "
            "use another path"
        ),
    ):
        SQLiteBoard(path)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=re.escape("max_wait_s must be a number >= 0, got -1")):
        SQLiteDatabase(None, schema=SCHEMA, max_wait_s=-1)
    with pytest.raises(
        ValueError,
        match=re.escape("synchronous must be one of ['OFF', 'NORMAL', 'FULL', 'EXTRA'], got 1"),
    ):
        SQLiteDatabase(None, schema=SCHEMA, synchronous=1)  # type: ignore[arg-type]
