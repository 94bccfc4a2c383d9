"""The gateway's group commit (:meth:`SessionStore.commit`): events are written at once, in
order, and a commit returns only once a round of fsyncs that began after its write has ended;
the rounds run off the event loop and take every file written since the last one."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest

from agent_memory.gateway import records
from agent_memory.gateway.records import SessionStore


async def _until(condition, what: str) -> None:
    for _ in range(3000):  # a deadlock guard, not a speed bound
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def test_commits_wait_for_an_fsync_round_that_began_after_their_write(tmp_path, monkeypatch):
    rounds: list[list[str]] = []
    gate = threading.Event()

    def fsync(paths):  # the worker thread's round, held until the test lets it go
        rounds.append(sorted(p.name for p in paths))
        assert gate.wait(60)

    monkeypatch.setattr(records, "_fsync", fsync)

    async def scenario() -> None:
        store = SessionStore(tmp_path / "s")
        first = asyncio.create_task(store.commit("a", {"kind": "rewrite", "rewrite": "note"}))
        await _until(lambda: len(rounds) == 1, "the first round began")
        # The event loop runs on while the round's fsync blocks its thread.
        later = [
            asyncio.create_task(store.commit(name, {"kind": "rewrite", "rewrite": "fold"}))
            for name in ("a", "b", "c")
        ]
        await asyncio.sleep(0.05)
        # Written and readable at once, in order; durable (and so answered) not yet.
        assert (tmp_path / "s/a.jsonl").read_text().count("\n") == 2
        assert not first.done() and not any(t.done() for t in later)
        gate.set()
        await asyncio.gather(first, *later)
        assert store.sessions["a"].pending_rewrite == "fold"

    asyncio.run(scenario())
    # Two rounds for four commits: the second took every file written while the first ran
    # (and the directory, whose new entries b and c are).
    assert rounds == [["a.jsonl", "s"], ["a.jsonl", "b.jsonl", "c.jsonl", "s"]]


def test_an_fsync_that_fails_fails_the_commits_waiting_on_it(tmp_path, monkeypatch):
    def fsync(paths):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records, "_fsync", fsync)
    store = SessionStore(tmp_path)
    with pytest.raises(OSError, match=re.escape("No space left on device")):
        asyncio.run(store.commit("a", {"kind": "end"}))
    # Without fsync, a commit is the write alone.
    unsynced = SessionStore(tmp_path / "n", fsync=False)
    asyncio.run(unsynced.commit("a", {"kind": "end"}))
    assert json.loads((tmp_path / "n/a.jsonl").read_text())["kind"] == "end"
