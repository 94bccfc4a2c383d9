"""EpisodeStore: scopes, ranking, pruning, lock retries, concurrent processes and SIGKILL."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import pickle
import re
import signal
import sqlite3
import threading
import time

import pytest

from agent_memory.memory.episodic.store import EpisodeStore, MemoryRow, Scope, StoreBusyError

RUN = Scope("single_run", namespace="ns", run_id="run-1")


def _row(key="k", won=None, ret=None, length=None, text="t", kind="episode", **kw) -> MemoryRow:
    return MemoryRow(kind, key, f"task {key}", text, won=won, ret=ret, length=length, **kw)


def test_scopes_select_rows_by_retention_run_session_and_namespace(tmp_path):
    store = EpisodeStore(tmp_path / "db.sqlite")
    scopes = {
        "run1": RUN,
        "run2": Scope("single_run", namespace="ns", run_id="run-2"),
        "s1a": Scope("session", namespace="ns", run_id="a", session_id="s1"),
        "s1b": Scope("session", namespace="ns", run_id="b", session_id="s1"),
        "s2": Scope("session", namespace="ns", run_id="c", session_id="s2"),
        "p": Scope("persistent", namespace="ns", run_id="d", session_id="s1"),
        "p_other": Scope("persistent", namespace="other", run_id="e"),
    }
    for name, scope in scopes.items():
        store.add(scope, [_row(text=name)])
    seen = {name: [r.text for r in store.rows(s)] for name, s in scopes.items()}
    assert seen == {
        "run1": ["run1"],
        "run2": ["run2"],
        "s1a": ["s1a", "s1b"],
        "s1b": ["s1a", "s1b"],
        "s2": ["s2"],
        "p": ["p"],
        "p_other": ["p_other"],
    }
    assert store.delete_scope(scopes["s1b"]) == 2 and store.count() == 5
    assert store.delete_scope(RUN) == 1 and store.count(scopes["run2"]) == 1
    r = store.rows(scopes["p"])[0]
    assert (r.retention, r.namespace, r.run_id, r.session_id) == ("persistent", "ns", "d", "s1")
    assert r.writer.endswith(f":{os.getpid()}") and r.created_at > 0
    store.close()


def test_best_ranks_won_then_return_then_length_then_recency(tmp_path):
    store = EpisodeStore(tmp_path / "db.sqlite")
    store.add(
        RUN,
        [
            _row(won=False, ret=5.0, length=1, text="lost"),
            _row(won=True, ret=1.0, length=9, text="won long"),
            _row(won=None, ret=9.0, length=1, text="unknown"),
            _row(won=True, ret=1.0, length=3, text="won short"),
            _row(won=True, ret=2.0, length=20, text="won rich"),
            _row(won=True, ret=1.0, length=3, text="won short newer"),
            _row(won=True, ret=1.0, length=3, text="a note", kind="note"),
            _row(key="other", won=True, ret=9.0, length=1, text="other task"),
        ],
    )
    assert [r.text for r in store.best(RUN, "k", limit=10)] == [
        "won rich",
        "won short newer",
        "won short",
        "won long",
        "unknown",
        "lost",
    ]
    assert [r.text for r in store.best(RUN, "k", limit=2, include_failures=False)] == [
        "won rich",
        "won short newer",
    ]
    assert store.best(RUN, "k", limit=1, order="recent", kinds=("note",))[0].text == "a note"
    assert [r.text for r in store.recent(RUN, limit=2)] == ["other task", "a note"]
    assert [(k, t) for _, k, t in store.tasks_since(RUN, 0)] == [
        ("k", "task k"),
        ("other", "task other"),
    ]
    assert store.tasks_since(RUN, 8) == []
    assert store.prune_task(RUN, "k", keep=2) == 4  # notes are never pruned per task
    assert [r.text for r in store.rows(RUN)] == [
        "won rich",
        "won short newer",
        "a note",
        "other task",
    ]
    store.close()


def test_set_outcome_expire_sessions_and_prune(tmp_path):
    store = EpisodeStore(tmp_path / "db.sqlite")
    s_old = Scope("session", namespace="ns", run_id="r", session_id="old")
    s_new = Scope("session", namespace="ns", run_id="r", session_id="new")
    store.add(s_old, [_row(kind="note", episode_uid="e1"), _row(kind="note", episode_uid="e2")])
    assert store.set_outcome(s_old, "e1", won=True, ret=2.5, length=7) == 1
    assert [(r.won, r.ret, r.length) for r in store.rows(s_old)] == [
        (True, 2.5, 7),
        (None, None, None),
    ]
    store.add(s_new, [_row()])
    now = time.time()
    assert store.expire_sessions("ns", ttl_s=60, now=now + 30) == 0
    store.add(s_new, [_row()])
    assert store.expire_sessions("other-ns", ttl_s=1, now=now + 3600) == 0
    store.db.write(
        lambda c: c.execute(
            "UPDATE memories SET created_at = ? WHERE session_id = 'old'", (now - 120,)
        )
    )
    assert store.expire_sessions("ns", ttl_s=60, now=now) == 2 and store.count() == 2
    p = Scope("persistent", namespace="ns", run_id="r")
    store.add(p, [_row(text=str(t)) for t in range(6)])
    assert store.prune("persistent", "ns", max_rows=4) == 2
    assert [r.text for r in store.rows(p)] == ["2", "3", "4", "5"]
    assert store.prune("persistent", "ns", max_age_s=10, now=time.time() + 11) == 4
    assert store.count() == 2  # session rows untouched
    store.close()


def test_add_with_keep_per_task_prunes_in_the_same_transaction(tmp_path):
    store = EpisodeStore(tmp_path / "db.sqlite")
    for n in (5, 3, 4, 2):
        store.add(RUN, [_row(won=True, ret=1.0, length=n)], keep_per_task=2)
    assert sorted(r.length for r in store.rows()) == [2, 3]
    store.close()


def test_pickles_without_its_connection_and_reconnects(tmp_path):
    store = EpisodeStore(tmp_path / "db.sqlite", busy_timeout_s=0.5)
    store.add(RUN, [_row()])
    clone = pickle.loads(pickle.dumps(store))
    assert (
        clone.count() == 1
        and clone.busy_timeout_s == 0.5
        and clone.db.connection() is not store.db.connection()
    )
    assert clone.db.read("PRAGMA journal_mode")[0][0] == "wal"
    store.close()
    clone.close()


def test_in_memory_database_and_newer_schema_refused(tmp_path):
    mem = EpisodeStore(":memory:")
    mem.add(RUN, [_row()])
    assert mem.count() == 1 and mem.integrity_check() == "ok"
    path = tmp_path / "db.sqlite"
    EpisodeStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(
        ValueError, match=re.escape("holds schema version 99, this code reads up to 1")
    ):
        EpisodeStore(path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"retention": "forever"},
            "retention must be one of ['single_run', 'session', 'persistent'], got 'forever'",
        ),
        ({"retention": "session", "run_id": "r"}, "retention='session' needs a session_id"),
        ({"retention": "persistent", "run_id": ""}, "run_id must be a non-empty str, got ''"),
        (
            {"retention": "persistent", "run_id": "r", "namespace": ""},
            "namespace must be a non-empty str, got ''",
        ),
    ],
)
def test_bad_scopes_are_named(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Scope(**kwargs)


# -- locks: SQLite's busy handler, then our retries ----------------------------------------------


def _hold_write_lock(path, seconds: float, held: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        "INSERT INTO memories (kind, retention, namespace, run_id, task_key, task, text, "
        "created_at) VALUES ('note', 'single_run', 'ns', 'holder', 'k', 't', 'x', 0)"
    )
    held.set()
    time.sleep(seconds)
    conn.execute("COMMIT")
    conn.close()


def test_writes_retry_past_the_busy_timeout_until_the_lock_frees(tmp_path):
    path = tmp_path / "db.sqlite"
    store = EpisodeStore(path, busy_timeout_s=0.01, max_wait_s=10)
    held = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 0.4, held))
    holder.start()
    held.wait()
    t0 = time.monotonic()
    store.add(RUN, [_row(text="after the lock")])
    waited = time.monotonic() - t0
    holder.join()
    assert waited >= 0.3 and store.retries > 0
    assert [r.text for r in store.rows()] == ["x", "after the lock"]
    assert store.count(RUN) == 1
    store.close()


def test_a_lock_held_past_max_wait_raises_a_clear_error(tmp_path):
    path = tmp_path / "db.sqlite"
    store = EpisodeStore(path, busy_timeout_s=0.01, max_wait_s=0.2)
    held = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, 1.0, held))
    holder.start()
    held.wait()
    with pytest.raises(
        StoreBusyError, match=re.escape("stayed locked for more than max_wait_s=0.2 s")
    ):
        store.add(RUN, [_row()])
    holder.join()
    store.add(RUN, [_row(text="later")])  # the connection is usable again
    assert store.count() == 2
    store.close()


# -- real processes ------------------------------------------------------------------------------

WRITES = 60


def _writer(path: str, w: int, start: mp.Event, out: mp.Queue) -> None:
    store = EpisodeStore(path, busy_timeout_s=0.005, max_wait_s=60)
    scope = Scope("session", namespace="ns", run_id=f"w{w}", session_id="shared")
    start.wait()
    seen_max = 0
    for i in range(WRITES):
        (rid,) = store.add(
            scope, [_row(key=f"k{i % 3}", won=i % 2 == 0, length=i, text=f"{w}:{i}")]
        )
        # Read-your-writes, and reads never go backwards while others write.
        best = store.best(scope, f"k{i % 3}", limit=500)
        assert any(r.id == rid for r in best)
        n = store.count(scope)
        assert n >= seen_max and n >= i + 1
        seen_max = n
        store.tasks_since(scope, 0)
    out.put((w, store.retries))
    store.close()


def test_concurrent_writer_processes_lose_and_corrupt_nothing(tmp_path):
    path = str(tmp_path / "db.sqlite")
    EpisodeStore(path).close()
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, w, start, out)) for w in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    reports = sorted(out.get(timeout=5) for _ in procs)
    assert [w for w, _ in reports] == [0, 1, 2, 3]
    store = EpisodeStore(path)
    texts = [r.text for r in store.rows()]
    assert sorted(texts) == sorted(f"{w}:{i}" for w in range(4) for i in range(WRITES))
    assert store.integrity_check() == "ok"
    for w in range(4):  # each writer's rows are in its own order
        mine = [int(t.split(":")[1]) for t in texts if t.startswith(f"{w}:")]
        assert mine == list(range(WRITES))
    store.close()


BATCH = 40


def _payload(seq: int) -> str:
    body = f"row {seq} " + "x" * 2000
    return body + "|" + hashlib.sha256(body.encode()).hexdigest()


def _kill_target(path: str, began: mp.Value, acked: mp.Value) -> None:
    store = EpisodeStore(path)
    scope = Scope("persistent", namespace="kill", run_id="victim")
    b = 0
    while True:
        began.value = b  # shared memory: visible to the parent at once, even after a kill
        rows = [_row(text=_payload(b * BATCH + j), length=b * BATCH + j) for j in range(BATCH)]
        store.add(scope, rows)
        acked.value = b + 1  # batches 0..b are committed
        b += 1


def test_sigkill_mid_transaction_keeps_exactly_the_committed_rows(tmp_path):
    ctx = mp.get_context("spawn")
    mid_transaction = 0
    for attempt in range(8):
        path = str(tmp_path / f"kill{attempt}.sqlite")
        began, acked = ctx.Value("q", -1, lock=False), ctx.Value("q", 0, lock=False)
        proc = ctx.Process(target=_kill_target, args=(path, began, acked))
        proc.start()
        deadline = time.monotonic() + 60
        while acked.value < 3 and time.monotonic() < deadline:  # a few committed batches first
            time.sleep(0.005)
        time.sleep(0.013 * (attempt + 1))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        assert proc.exitcode == -signal.SIGKILL
        store = EpisodeStore(path)  # recovers the WAL of the killed writer
        assert store.integrity_check() == "ok"
        rows = store.rows()
        seqs = [r.length for r in rows]
        committed = len(seqs) // BATCH
        # Whole transactions only: a prefix of batches, each row intact.
        assert len(seqs) % BATCH == 0 and seqs == list(range(len(seqs)))
        assert all(r.text == _payload(r.length) for r in rows)
        # Exactly the committed ones: every acknowledged batch, plus at most the one whose
        # COMMIT returned just before the kill landed (its ack was not written yet).
        assert acked.value <= committed <= acked.value + 1
        if began.value == committed == acked.value:  # killed inside batch `committed`'s add()
            mid_transaction += 1
        store.add(Scope("persistent", namespace="kill", run_id="after"), [_row()])
        assert store.count() == len(seqs) + 1
        store.close()
        if mid_transaction >= 2:
            break
    assert mid_transaction >= 2
