"""BlackboardMemory: notes shared across envs (groups / global) and processes (SQLite WAL)."""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_memory.memory import HistoryMemory, make_memory
from agent_memory.memory.blackboard import BlackboardMemory, episode_digest
from agent_memory.tokens import make_token_counter


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def store(mem, obs, action="look", env_ids=None):
    n = len(mem) if env_ids is None else len(env_ids)
    mem.store({"observation": [obs] * n, "action": [action] * n}, env_ids=env_ids)


def test_groups_see_their_own_notes_and_global_sees_all():
    mem = BlackboardMemory(4, top_n=10)
    mem.set_groups([0, 1, 2, 3], ["a", "a", "b", 7])
    mem.post(0, "from a", step=1)
    mem.post(2, "from b", step=2)
    mem.post(3, "from 7", step=3)
    assert [n["text"] for n in mem.notes(1)] == ["from a"]
    assert [n["text"] for n in mem.notes(2)] == ["from b"]
    assert mem.notes(3)[0] | {"ts": 0} == {
        "id": 3,
        "group_id": "7",
        "author": f"pid{os.getpid()}",
        "env_id": 3,
        "step": 3,
        "ts": 0,
        "text": "from 7",
    }
    glob = BlackboardMemory(2, scope="global", top_n=10)
    glob.post(0, "one")
    glob.set_groups([1], ["elsewhere"])
    glob.post(1, "two")
    store(glob, "room")
    ctx = glob.fetch(2).contexts
    assert (
        ctx[0]
        == ctx[1]
        == (
            "Shared notes (newest first):\n- [env 1, step 0] two\n- [env 0, step 0] one\n"
            "Recent steps:\n[Observation 1: 'room', Action 1: 'look']"
        )
    )


def test_newest_first_top_n_and_byte_identical_without_notes():
    mem = BlackboardMemory(2, top_n=2)
    hist = HistoryMemory(2)
    for t in range(4):
        for m in (mem, hist):
            store(m, f"obs {t}")
        assert mem.fetch(3) == hist.fetch(3)  # no notes yet: exactly HistoryMemory
    for k in range(5):
        mem.post(k % 2, f"note {k}")
    ctx = mem.fetch(2, env_ids=[1]).contexts[0]
    assert ctx.splitlines()[:3] == [
        "Shared notes (newest first):",
        "- [env 0, step 4] note 4",
        "- [env 1, step 4] note 3",
    ]
    assert ctx.endswith(hist.fetch(2, env_ids=[1]).contexts[0])
    assert mem.fetch(2).lengths == [2, 2]  # notes are not steps
    assert BlackboardMemory(1, top_n=0).fetch(1) == HistoryMemory(1).fetch(1)
    fresh = BlackboardMemory(1)
    fresh.post(0, "hi")
    assert fresh.fetch(3) == (["Shared notes (newest first):\n- [env 0, step 0] hi"], [0])
    assert fresh.fetch(0).contexts == fresh.fetch(3).contexts  # notes with no window too


def test_trimmed_by_count_and_by_age():
    clock = Clock()
    mem = BlackboardMemory(1, top_n=50, max_notes=3, max_age_seconds=10, clock=clock)
    for k in range(5):
        mem.post(0, f"n{k}")
        clock.t += 1
    assert [n["text"] for n in mem.board.dump("default")] == ["n2", "n3", "n4"]
    store(mem, "x")
    assert "n2" in mem.fetch(1).contexts[0]
    clock.t = 1000 + 2 + 10.5  # n2 (posted at 1002) is now older than 10 s
    ctx = mem.fetch(1).contexts[0]  # read-time expiry, even with the board unchanged
    assert "n2" not in ctx and "n3" in ctx
    clock.t = 1100
    mem.post(0, "late")  # a post deletes the expired notes
    assert [n["text"] for n in mem.board.dump("default")] == ["late"]


def test_episode_digest_and_post_actions():
    mem = BlackboardMemory(2, top_n=5, post_actions=True, digest_chars=60)
    mem.store({"observation": ["a", "b"], "action": ["open door", "look"]})
    assert [(n["env_id"], n["step"], n["text"]) for n in mem.notes(0)] == [
        (1, 1, "look"),
        (0, 1, "open door"),
    ]
    episode = {
        "records": [{"observation": "o", "action": "next"}] * 3 + [{"action": "blue"}],
        "num_steps": 4,
        "terminated": False,
        "truncated": True,
        "final_observation": "Time is up.\nBye.",
        "task": "t",
    }
    mem.on_episode_end(1, episode)
    digest = mem.notes(0)[0]
    assert digest["step"] == 4 and len(digest["text"]) <= 60
    assert digest["text"] == "Episode was cut off after 4 steps. | Actions (4): next; n..."
    assert episode_digest(episode, outcome=True, sep=" | ") == (
        "Episode was cut off after 4 steps. | Actions (4): next; next; next; blue | "
        "Last observation: Time is up.\nBye."
    )
    assert (
        episode_digest({"records": []}, outcome=True)
        == "Episode was left unfinished after 0 steps.\nActions (0): "
    )
    long = BlackboardMemory(1, note_chars=10)
    long.post(0, "a  very\nlong note indeed")
    assert long.notes(0)[0]["text"] == "a very ..."


def test_budget_covers_notes_and_window_and_drops_oldest_notes_first():
    counter = make_token_counter("estimate")
    mem = BlackboardMemory(1, top_n=4)
    hist = HistoryMemory(1)
    for t in range(6):
        for m in (mem, hist):
            store(m, f"observation number {t}")
    for k in range(4):
        mem.post(0, f"shared note number {k}")
    full = mem.fetch(3).contexts[0]
    window3 = counter(hist.fetch(3).contexts[0])
    kept = set()
    for budget in range(0, counter(full) + 10):
        ctx = mem.fetch(3, max_history_tokens=budget).contexts[0]
        assert counter(ctx) <= budget
        notes = [line for line in ctx.splitlines() if line.startswith("- [")]
        kept.add(len(notes))
        # The newest notes survive; the oldest go first.
        assert (
            notes
            == [f"- [env 0, step 6] shared note number {k}" for k in (3, 2, 1, 0)][: len(notes)]
        )
        if budget < window3:
            assert ctx == hist.fetch(3, max_history_tokens=budget).contexts[0]
    assert kept == {0, 1, 2, 3, 4}


@pytest.mark.parametrize("fmt", ["chat", "search"])
def test_budget_holds_for_other_formatters(fmt):
    counter = make_token_counter("estimate")
    mem = BlackboardMemory(1, fmt, top_n=3)
    for t in range(5):
        store(mem, f"observation number {t}")
        mem.post(0, f"note {t} " * (t + 1))
    for budget in range(0, 120):
        ctx = mem.fetch(3, max_history_tokens=budget).contexts[0]
        text = ctx if isinstance(ctx, str) else "".join(m["content"] + "\n" for m in ctx)
        assert counter(text) <= budget, (fmt, budget)


def test_two_memories_on_one_file_share_the_board(tmp_path):
    path = tmp_path / "boards" / "bb.sqlite"
    a = BlackboardMemory(2, path=path, author="worker-a")
    b = BlackboardMemory(2, path=str(path), author="worker-b")
    for m in (a, b):
        m.set_groups([0, 1], ["g1", "g2"])
        store(m, "start")
    assert a.fetch(1) == b.fetch(1)  # no notes yet (and a's cache is warm)
    b.post(0, "b found the exit")
    ctx = a.fetch(1).contexts  # a sees b's note at once (cache invalidated by data_version)
    assert "b found the exit" in ctx[0] and "b found" not in ctx[1]
    assert a.notes(0)[0]["author"] == "worker-b"
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    other_board = BlackboardMemory(2, path=path, board="other")
    assert other_board.notes(0) == []


WRITER = textwrap.dedent(
    """
    import os, sys, time
    from agent_memory.memory.blackboard import BlackboardMemory
    path, worker, n, go, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    mem = BlackboardMemory(4, path=path, author=worker, max_notes=None, scope="global")
    print("ready", flush=True)
    while not os.path.exists(go):  # every writer starts at once, however slow its start-up
        time.sleep(0.001)
    for k in range(n):
        if k == n // 2:  # a barrier: no writer starts its second half before all wrote their first
            open(f"{go}.{worker}", "w").close()
            while not all(os.path.exists(f"{go}.w{w}") for w in range(workers)):
                time.sleep(0.001)
        if k % 10 == 0:
            mem.post_many([0, 1, 2], [f"{worker}:{k}:{e}" for e in range(3)])
        else:
            mem.post(k % 4, f"{worker}:{k}")
    print("ok")
    """
)


def test_concurrent_writers_in_separate_processes_lose_no_notes(tmp_path):
    path = tmp_path / "shared.sqlite"
    BlackboardMemory(1, path=path)  # create the schema (the writers would race to, safely)
    workers, n = 4, 150
    go = tmp_path / "go"  # created once every writer is ready: all start at the same moment
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), f"w{w}", str(n), str(go), str(workers)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err
    reader = BlackboardMemory(1, path=path, max_notes=None)
    notes = reader.board.dump("default")
    per_worker = n + 2 * (n // 10)  # post_many writes 3 notes every 10th post
    assert len(notes) == workers * per_worker
    texts = {x["text"] for x in notes}
    for w in range(workers):
        for k in range(n):
            want = [f"w{w}:{k}:{e}" for e in range(3)] if k % 10 == 0 else [f"w{w}:{k}"]
            assert set(want) <= texts
    assert len({x["id"] for x in notes}) == len(notes)
    # Writers interleaved, and each writer's notes stay in its order. The mid-run barrier makes
    # every writer's second half follow every first half, so even writers that otherwise ran one
    # after another switch at least workers - 1 times in each half (scheduling cannot undo this).
    authors = [x["author"] for x in notes]
    assert sum(a != b for a, b in itertools.pairwise(authors)) >= 2 * (workers - 1)
    for w in range(workers):
        mine = [int(x["text"].split(":")[1]) for x in notes if x["author"] == f"w{w}"]
        assert mine == sorted(mine)


def test_state_dict_round_trip_private_board():
    clock = Clock()
    mem = BlackboardMemory(3, top_n=3, clock=clock, formatter="search", max_history_tokens=200)
    mem.set_groups([0, 1, 2], ["x", "x", "y"])
    for t in range(5):
        store(mem, f"obs {t}", env_ids=[0, 2] if t % 2 else None)
        mem.post(t % 3, f"note {t}")
        clock.t += 1
    state = json.loads(json.dumps(mem.state_dict()))
    other = BlackboardMemory(3, top_n=3, clock=clock, formatter="search", max_history_tokens=200)
    other.load_state_dict(state)
    assert other.state_dict() == mem.state_dict()
    assert other.fetch(4) == mem.fetch(4)
    for m in (mem, other):
        m.post(1, "after")
        store(m, "more")
    assert other.fetch(2) == mem.fetch(2)
    with pytest.raises(
        ValueError, match=re.escape("cannot load state: expected num_envs=2, got 3")
    ):
        BlackboardMemory(2).load_state_dict(state)


def test_state_dict_of_a_file_board_keeps_the_notes_in_the_file(tmp_path):
    mem = BlackboardMemory(1, path=tmp_path / "b.sqlite")
    mem.post(0, "persisted")
    store(mem, "o")
    state = mem.state_dict()
    assert state["notes"] is None and state["config"]["path"] == str(tmp_path / "b.sqlite")
    mem.close()
    again = BlackboardMemory(1, path=state["config"]["path"])
    again.load_state_dict(state)
    assert "persisted" in again.fetch(1).contexts[0]
    assert again.state_dict() == state


def test_chat_formatter_gets_a_notes_message():
    mem = BlackboardMemory(1, "chat")
    mem.post(0, "hint")
    store(mem, "door")
    assert mem.fetch(1).contexts[0] == [
        {"role": "user", "content": "Shared notes (newest first):\n- [env 0, step 0] hint"},
        {"role": "user", "content": "door"},
        {"role": "assistant", "content": "look"},
    ]


def test_registered_for_make_memory(tmp_path):
    mem = make_memory(
        "blackboard",
        num_envs=3,
        formatter="simple",
        token_counter="estimate",
        max_history_tokens=None,
        capacity=4,
        path=str(tmp_path / "bb.db"),
        scope="global",
        top_n=2,
    )
    assert isinstance(mem, BlackboardMemory) and mem.capacity == 4 and mem.scope == "global"
    mem.reset([1])
    assert Path(tmp_path / "bb.db").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scope": "team"}, "scope must be one of ['group', 'global'], got 'team'"),
        ({"top_n": -1}, "top_n must be an int >= 0, got -1"),
        ({"max_notes": 0}, "max_notes must be None or an int >= 1, got 0"),
        ({"max_age_seconds": -5}, "max_age_seconds must be None or a number > 0, got -5"),
        ({"digest_chars": 0}, "digest_chars must be an int >= 1, got 0"),
        ({"board": ""}, "board must be a non-empty str, got ''"),
        (
            {"note_format": "{who}: {text}"},
            "note_format may use the fields text, env_id, step, group, author; '{who}: {text}' fails: KeyError('who')",
        ),
        ({"header": ""}, "header must be a non-empty str, got ''"),
    ],
)
def test_bad_config_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        BlackboardMemory(2, **kwargs)


def test_bad_calls_are_refused():
    mem = BlackboardMemory(2)
    with pytest.raises(
        ValueError, match=re.escape("group_ids must hold one id per env (2), got 1 values")
    ):
        mem.set_groups([0, 1], ["a"])
    with pytest.raises(
        ValueError, match=re.escape("group_ids must hold one id per env (1), got a str")
    ):
        mem.set_groups([0], "a")
    with pytest.raises(IndexError, match=re.escape("env_ids must be in [0, 2), got [5]")):
        mem.post(5, "x")
    with pytest.raises(ValueError, match=re.escape("texts must hold one note per env (2)")):
        mem.post_many([0, 1], ["only one"])
