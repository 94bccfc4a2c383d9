"""EpisodicMemory: window contract, recording and retrieval, agent control, retention, state, and a
prompt-only policy that solves a FrozenLake map from a past episode through VectorHistoryWrapper."""

from __future__ import annotations

import json
import multiprocessing as mp
import re

import gymnasium as gym
import numpy as np
import pytest

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.memory import HistoryMemory, make_memory
from agent_memory.memory.episodic import (
    AGENT_INSTRUCTIONS,
    EpisodicMemory,
    episode_digest,
    lexical_scores,
    task_key_of,
)
from agent_memory.parsing import ActionParser
from agent_memory.wrappers import VectorHistoryWrapper

TASK = "Walk from the start S to the goal G on the frozen lake without falling into a hole H."


def _mem(tmp_path, num_envs=2, **kw) -> EpisodicMemory:
    kw.setdefault("path", tmp_path / "episodes.sqlite")
    kw.setdefault("env_name", "lake")
    return EpisodicMemory(num_envs, **kw)


def _episode(actions, *, won, ret=None, task=TASK, first_obs="start", final="end", trunc=False):
    records = [
        {"observation": first_obs if t == 0 else f"o{t}", "action": a}
        for t, a in enumerate(actions)
    ]
    return {
        "records": records,
        "final_observation": final,
        "num_steps": len(actions),
        "first_step": 1,
        "terminated": not trunc,
        "truncated": trunc,
        "task": task,
        "return": (1.0 if won else 0.0) if ret is None else ret,
        "won": won,
    }


def _play(mem, env_id, actions, *, won, task=TASK, first_obs="start", **kw):
    """One episode through the memory as the wiring drives it: start, store steps, end."""
    mem.on_episode_start(env_id, task, first_obs)
    for t, a in enumerate(actions):
        obs = first_obs if t == 0 else f"o{t}"
        mem.store({"observation": [obs], "action": [a]}, env_ids=[env_id])
    return mem.on_episode_end(
        env_id, _episode(actions, won=won, task=task, first_obs=first_obs, **kw)
    )


# -- the window part behaves exactly like HistoryMemory -----------------------------------------


@pytest.mark.parametrize("formatter", ["simple", "search", "chat"])
def test_without_a_block_fetch_equals_history_memory(tmp_path, formatter):
    mem, ref = (
        _mem(tmp_path, 3, formatter=formatter, max_history_tokens=40),
        HistoryMemory(3, formatter, max_history_tokens=40),
    )
    for t in range(7):
        rec = {"observation": [f"obs {t} {i}" for i in range(3)], "action": ["up"] * 3}
        mem.store(rec)
        ref.store(rec)
    mem.reset([1])
    ref.reset([1])
    for hl in (0, 2, -1):
        assert mem.fetch(hl) == ref.fetch(hl)
        assert mem.fetch(hl, env_ids=[2, 0], max_history_tokens=[10, None]) == ref.fetch(
            hl, env_ids=[2, 0], max_history_tokens=[10, None]
        )
    assert [mem.num_steps(i) for i in range(3)] == [7, 0, 7]
    assert mem[0] == ref[0] and len(mem) == 3
    assert mem.formatter.spec() == ref.formatter.spec() and mem.max_history_tokens == 40


def test_registered_as_episodic(tmp_path):
    mem = make_memory(
        "episodic",
        num_envs=2,
        formatter="simple",
        token_counter="estimate",
        max_history_tokens=None,
        capacity=None,
        path=str(tmp_path / "db.sqlite"),
    )
    assert isinstance(mem, EpisodicMemory) and len(mem) == 2
    mem.close()


# -- recording and retrieval ---------------------------------------------------------------------


def test_episode_end_records_digest_and_start_retrieves_best_first(tmp_path):
    mem = _mem(tmp_path)
    assert _play(mem, 0, ["down"], won=False) is not None
    _play(mem, 0, ["right", "right", "left", "down", "down"], won=True)
    _play(mem, 1, ["right", "down", "down"], won=True)  # shorter win: best
    row = mem.store_.rows()[-1]
    assert (row.kind, row.task, row.won, row.ret, row.length) == ("episode", TASK, True, 1.0, 3)
    assert row.task_key == task_key_of(TASK, "start", "lake") and row.run_id == mem.run_id
    assert row.started_at <= row.created_at and row.episode_uid.startswith(mem.run_id)

    block = mem.on_episode_start(1, TASK, "start")
    assert block == mem.block(1)
    assert block.splitlines()[0] == "Past episodes of this task:"
    entries = re.findall(r"^\d+\. \[this task\] (.*)$", block, re.M)
    assert entries == [
        "won in 3 steps (return 1.00)",
        "won in 5 steps (return 1.00)",
        "failed after 1 step (return 0.00)",
    ]
    assert "Actions (3): right; down; down" in block and "Last observation: end" in block
    # The block starts every context of the episode; lengths count window steps only.
    mem.store({"observation": ["start"], "action": ["right"]}, env_ids=[1])
    ctx, n = mem.fetch(2, env_ids=[1])
    assert n == [1] and ctx[0] == block + "\n\n[Observation 1: 'start', Action 1: 'right']"
    mem.close()


def test_failures_are_lessons_unless_disabled_and_duplicates_shown_once(tmp_path):
    mem = _mem(tmp_path, top_k=3)
    for _ in range(3):
        _play(mem, 0, ["right", "down"], won=True)
    _play(mem, 0, ["down"], won=False)
    block = mem.on_episode_start(0, TASK, "start")
    assert block.count("won in 2 steps") == 1 and "failed after 1 step" in block
    only_wins = _mem(tmp_path, include_failures=False, namespace="wins-only")
    _play(only_wins, 1, ["up"], won=False, first_obs="other level")
    assert only_wins.on_episode_start(1, TASK, "other level") == ""
    mem.close()
    only_wins.close()


def test_task_key_uses_first_observation_and_similar_tasks_come_second(tmp_path):
    mem = _mem(tmp_path, top_k=3, min_similarity=0.3)
    _play(mem, 0, ["right"], won=True, first_obs="level A")
    _play(
        mem,
        0,
        ["left"],
        won=True,
        task="Cook a meal with the recipe in the kitchen.",
        first_obs="level C",
    )
    block = mem.on_episode_start(0, TASK, "level B")  # same sentence, another level
    assert "[this task]" not in block
    assert re.search(r"1\. \[similar task \(1\.00\): Walk from the start", block)
    assert "Actions (1): right" in block and "Cook" not in block  # unrelated task not retrieved
    assert mem.on_episode_start(0, TASK, "level A").count("[this task]") == 1
    by_task = _mem(tmp_path, key_by="task", namespace="by-task")
    _play(by_task, 0, ["right"], won=True, first_obs="level A")
    assert "[this task]" in by_task.on_episode_start(0, TASK, "level B")
    no_similar = _mem(tmp_path, similar_tasks=False)
    assert no_similar.on_episode_start(0, TASK, "level B") == ""
    for m in (mem, by_task, no_similar):
        m.close()


def test_similarity_accepts_a_callable_backend(tmp_path):
    calls = []

    def scorer(query, docs):
        calls.append((query, list(docs)))
        return [1.0 if "goal" in d else 0.0 for d in docs]

    mem = _mem(tmp_path, similarity=scorer)
    _play(mem, 0, ["right"], won=True, first_obs="level A")
    assert "similar task (1.00)" in mem.on_episode_start(0, "Reach the goal.", "x")
    assert calls and calls[0][1] == [TASK]
    mem.close()


def test_similarity_from_the_embeddings_module(tmp_path):
    pytest.importorskip("agent_memory.memory.search")
    mem = _mem(tmp_path, similarity="embedding:hashing", min_similarity=0.2)
    _play(mem, 0, ["right"], won=True, first_obs="level A")
    _play(mem, 0, ["left"], won=True, task="Sort the invoices by date.", first_obs="x")
    block = mem.on_episode_start(0, "Walk from the start to the goal on the lake.", "y")
    assert "[similar task (0." in block and "Actions (1): right" in block and "left" not in block
    with pytest.raises(ValueError, match=re.escape("expected a dense encoder")):
        _mem(tmp_path, similarity="embedding:bm25")
    mem.close()


def test_digest_is_bounded_and_skips_invalid_actions():
    long = [f"go to room {t}" for t in range(500)] + ["[invalid: no <action>...</action> tag]"]
    ep = {
        "records": [{"observation": "x" * 5000, "action": a} for a in long],
        "final_observation": "y" * 5000,
        "num_steps": 900,
        "first_step": 400,
    }
    text = episode_digest(ep, max_actions=10, obs_chars=50, max_chars=300)
    assert len(text) <= 300
    assert text.startswith("Actions (500, 1 invalid left out, steps 1-399 not kept): go to room 0;")
    assert "... 490 more ..." in text and "invalid" not in text.split(":", 1)[1].split("\n")[0]
    assert episode_digest({"records": []}) == "Actions (0): "


def test_block_is_capped_dropping_least_relevant_entries(tmp_path):
    mem = _mem(tmp_path, top_k=3, max_block_chars=200)
    _play(mem, 0, ["right"] * 3, won=True, final="a" * 100)
    _play(mem, 0, ["down"] * 5, won=True, final="b" * 100)
    block = mem.on_episode_start(0, TASK, "start")
    assert len(block) <= 200 and "1. [this task] won in 3 steps" in block and "2." not in block
    mem.close()


def test_task_index_scores_equal_lexical_scores_and_rank_ties_by_recency():
    from agent_memory.memory.episodic.tasks import TaskIndex as _TaskIndex

    rng = np.random.default_rng(0)
    words = ["box", "lake", "goal", "hole", "the", "push", "walk", "key", "door", "red"]
    texts = [" ".join(rng.choice(words, size=rng.integers(0, 8))) for _ in range(300)]
    index = _TaskIndex()
    for j, t in enumerate(texts):
        index.add(f"k{j}", t, newest=j + 1)
    index.add("k0", texts[0], newest=999)  # a known key only moves its newest id
    assert len(index.keys) == 300 and index.seen == 999
    for query in ("push the red box", "walk to the goal hole", "the", "zebra"):
        assert np.allclose(index.scores(query), lexical_scores(query, texts))
    index2 = _TaskIndex()
    for j, t in enumerate(["red box", "red box", "red", "blue"]):
        index2.add(f"k{j}", t, newest=j + 1)
    scores = index2.scores("red box")
    assert index2.top(scores, 2, 0.1, exclude="none") == [1, 0]  # tie: newer first
    assert index2.top(scores, 5, 0.1, exclude="k1") == [0, 2]
    assert index2.top(scores, 5, 1.01, exclude="none") == []


def test_lexical_scores():
    s = lexical_scores(
        "frozen lake hole", ["frozen lake", "push the box", "", "a hole in the lake"]
    )
    assert s[1] == s[2] == 0.0 and s[0] > 0 and s[3] > 0
    assert lexical_scores("", ["x"]) == [0.0] and lexical_scores("x", []) == []


# -- budgets and formats -------------------------------------------------------------------------


def test_token_budget_counts_the_block_first(tmp_path):
    mem = _mem(tmp_path, 2, token_counter="chars")
    _play(mem, 0, ["right"], won=True)
    block = mem.on_episode_start(0, TASK, "start")
    mem.on_episode_start(1, TASK, "start")
    for t in range(4):
        mem.store({"observation": [f"s{t}", f"s{t}"], "action": ["up", "up"]})
    step = len("[Observation 1: 's0', Action 1: 'up']\n")
    need = len(block) + 2
    ctx, n = mem.fetch(-1, max_history_tokens=need + 2 * step)
    assert n == [2, 2] and ctx[0].startswith(block) and len(ctx[0]) <= need + 2 * step
    ctx, n = mem.fetch(-1, max_history_tokens=[need - 1, need - 1])  # the block alone does not fit
    assert not ctx[0].startswith("Past") and n[0] == (need - 1) // step
    assert mem.fetch(0).contexts[0] == block and mem.fetch(0).lengths == [0, 0]
    with pytest.raises(ValueError, match=re.escape("max_history_tokens has 1 budgets, expected 2")):
        mem.fetch(1, max_history_tokens=[5])
    mem.close()


def test_in_fetch_false_leaves_the_block_to_the_prompt(tmp_path):
    mem = _mem(tmp_path, 1, in_fetch=False)
    _play(mem, 0, ["right"], won=True)
    assert mem.on_episode_start(0, TASK, "start").startswith("Past episodes")
    mem.store({"observation": ["start"], "action": ["right"]})
    assert mem.fetch(3).contexts == ["[Observation 1: 'start', Action 1: 'right']"]
    mem.close()


def test_chat_formatter_gets_the_block_as_a_message(tmp_path):
    mem = _mem(tmp_path, 1, formatter="chat", block_role="system")
    _play(mem, 0, ["right"], won=True)
    block = mem.on_episode_start(0, TASK, "start")
    mem.store({"observation": ["start"], "action": ["right"]})
    assert mem.fetch(3).contexts[0] == [
        {"role": "system", "content": block},
        {"role": "user", "content": "start"},
        {"role": "assistant", "content": "right"},
    ]
    mem.close()


# -- agent control -------------------------------------------------------------------------------


def test_agent_mode_record_and_retrieve_through_intercept(tmp_path):
    mem = _mem(
        tmp_path, control="agent", max_memory_actions=2, show_replies=1, retention="persistent"
    )
    assert AGENT_INSTRUCTIONS in mem.block(0)  # the hint shows from the start
    mem.on_episode_start(0, TASK, "start")
    assert mem.intercept(0, "<think>go</think><action>right</action>") is None
    assert mem.intercept(0, None) is None and mem.intercept(0, "<record></recorded>") is None
    reply = mem.intercept(0, "<think>lesson</think><record>The hole is\n below the start.</record>")
    assert re.fullmatch(r"Memory: recorded note \d+: The hole is below the start\.", reply)
    assert mem.block(0).endswith(reply) and mem.fetch(1).contexts[0] == mem.block(0)
    note = mem.store_.rows()[-1]
    assert (note.kind, note.text, note.won) == ("note", "The hole is below the start.", None)
    reply = mem.intercept(0, "<retrieve>hole start</retrieve>")
    assert reply.startswith("Memory results for 'hole start':\n1. [this task, note, open] The hole")
    assert mem.block(0).endswith(reply) and "recorded note" not in mem.block(0)  # show_replies=1
    assert mem.intercept(0, "<retrieve>again</retrieve>") is None  # limit reached: to the env
    # The episode's outcome reaches its notes; agent mode records no digest.
    assert mem.on_episode_end(0, _episode(["right"], won=True)) is None
    note = mem.store_.rows()[-1]
    assert (note.kind, note.won, note.ret, note.length) == ("note", True, 1.0, 1)
    # Another env of another run (same persistent namespace) finds the note.
    other = _mem(tmp_path, 1, control="agent", retention="persistent")
    other.on_episode_start(0, TASK, "start")
    assert "The hole is below the start." in other.intercept(0, "<retrieve>hole</retrieve>")
    assert other.intercept(0, "<retrieve>zebra</retrieve>") == "Memory: nothing matches 'zebra'."
    mem.close()
    other.close()


def test_static_mode_never_intercepts_and_both_mode_does_both(tmp_path):
    static = _mem(tmp_path)
    assert static.intercept(0, "<record>x</record>") is None
    both = _mem(tmp_path, control="both")
    _play(both, 0, ["right"], won=True)
    block = both.on_episode_start(0, TASK, "start")
    assert block.startswith("Past episodes of this task:") and AGENT_INSTRUCTIONS in block
    assert both.intercept(0, "<record>a</record> then <retrieve>right</retrieve>").count("\n") >= 2
    static.close()
    both.close()


# -- retention -----------------------------------------------------------------------------------


def test_single_run_rows_are_private_to_the_run_and_deleted_on_close(tmp_path):
    run = _mem(tmp_path, retention="single_run", run_id="run-1")
    worker = _mem(tmp_path, retention="single_run", run_id="run-1", purge_on_close=False)
    stranger = _mem(tmp_path, retention="single_run", run_id="run-2")
    _play(worker, 0, ["right"], won=True)
    assert "won in 1 step" in run.on_episode_start(0, TASK, "start")  # same run, other process
    assert stranger.on_episode_start(0, TASK, "start") == ""
    worker.close()  # a worker of the run: rows stay
    assert run.store_.count(run.scope) == 1
    run.close()
    assert (
        run.store_.closed
        and EpisodicMemory(
            1, path=tmp_path / "episodes.sqlite", retention="single_run", run_id="run-1"
        ).store_.count()
        == 0
    )
    stranger.close()


def test_session_rows_are_shared_by_runs_and_end_with_the_session(tmp_path):
    a = _mem(tmp_path, retention="session", session_id="s1", run_id="r1")
    b = _mem(tmp_path, retention="session", session_id="s1", run_id="r2")
    c = _mem(tmp_path, retention="session", session_id="s2", run_id="r3")
    _play(a, 0, ["right"], won=True)
    _play(c, 0, ["down"], won=True)
    assert "Actions (1): right" in b.on_episode_start(0, TASK, "start")
    assert "Actions (1): down" in c.on_episode_start(0, TASK, "start")
    a.close()  # closing a run leaves the session's rows
    assert b.end_session() == 1 and b.on_episode_start(0, TASK, "start") == ""
    assert c.store_.count() == 1
    with pytest.raises(
        ValueError,
        match=re.escape(
            "end_session() deletes a session's rows, but this memory's retention is "
            "'single_run': expected 'session'"
        ),
    ):
        _mem(tmp_path).end_session()
    b.close()
    c.close()


def test_session_ttl_expires_idle_sessions(tmp_path):
    mem = _mem(tmp_path, retention="session", session_id="old")
    _play(mem, 0, ["right"], won=True)
    store = mem.store_
    store.db.write(lambda c: c.execute("UPDATE memories SET created_at = created_at - 7200"))
    fresh = _mem(tmp_path, retention="session", session_id="new")
    _play(fresh, 0, ["right"], won=True)
    _mem(tmp_path, retention="session", session_id="new", session_ttl_s=3600).close()
    assert [r.session_id for r in store.rows()] == ["new"]
    mem.close()
    fresh.close()


def _persistent_child(path: str) -> None:
    mem = EpisodicMemory(
        1, path=path, env_name="lake", run_id="child-run", session_id="x", retention="persistent"
    )
    _play(mem, 0, ["right", "down"], won=True)
    mem.close()


def test_persistent_rows_survive_processes_and_prune(tmp_path):
    path = str(tmp_path / "episodes.sqlite")
    proc = mp.get_context("spawn").Process(target=_persistent_child, args=(path,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    # A new run and session.
    mem = EpisodicMemory(1, path=path, env_name="lake", session_id="y", retention="persistent")
    assert "Actions (2): right; down" in mem.on_episode_start(0, TASK, "start")
    assert mem.store_.rows()[0].run_id == "child-run"
    mem.close()
    capped = EpisodicMemory(
        1,
        path=path,
        env_name="lake",
        max_rows=3,
        prune_every=2,
        max_rows_per_task=None,
        retention="persistent",
    )
    for t in range(4):
        _play(capped, 0, ["up"] * (t + 1), won=False, first_obs=f"level {t}")
    assert [r.length for r in capped.store_.rows()] == [2, 3, 4]  # pruned to the newest 3
    capped.store_.db.write(lambda c: c.execute("UPDATE memories SET created_at = 0 WHERE id < 5"))
    assert capped.maintain() == 0
    aged = EpisodicMemory(1, path=path, max_age_s=60.0, retention="persistent")
    assert [r.length for r in aged.store_.rows()] == [4]
    capped.close()
    aged.close()


def test_max_rows_per_task_keeps_the_best(tmp_path):
    mem = _mem(tmp_path, max_rows_per_task=2)
    _play(mem, 0, ["a"] * 5, won=True)
    _play(mem, 0, ["a"], won=False)
    _play(mem, 0, ["a"] * 3, won=True)
    _play(mem, 0, ["a"] * 4, won=True)
    assert sorted(r.length for r in mem.store_.rows()) == [3, 4]
    mem.close()


# -- episode bookkeeping, state ------------------------------------------------------------------


def test_end_after_reset_same_step_order_and_unfinished_episodes(tmp_path):
    mem = _mem(tmp_path, control="both", retention="persistent")
    mem.on_episode_start(0, TASK, "start")
    mem.intercept(0, "<record>note in episode 1</record>")
    mem.reset([0])  # SAME_STEP: the wrapper restarts the env before the rollout ends it
    mem.on_episode_start(0, TASK, "start")
    mem.on_episode_end(0, _episode(["right"], won=True))
    note = next(r for r in mem.store_.rows() if r.kind == "note")
    assert note.won is True  # attributed to the episode it was written in
    unfinished = _episode(["up"], won=None)
    unfinished.update(terminated=False, truncated=False)
    assert mem.on_episode_end(1, unfinished) is None
    other = _mem(tmp_path, record_unfinished=True, retention="persistent")
    assert other.on_episode_end(1, unfinished) is not None
    row = mem.store_.rows()[-1]
    assert row.won is None and "outcome unknown" in mem.on_episode_start(1, TASK, "start")
    mem.close()


def test_batched_start_and_end(tmp_path):
    mem = _mem(tmp_path, 4)
    blocks = mem.start_episodes([0, 1, 2, 3], [TASK] * 4, ["start"] * 4)
    assert blocks == [""] * 4
    ids = mem.end_episodes([2, 0], [_episode(["right"], won=True), _episode(["up"], won=False)])
    assert len(ids) == 2 and ids[0] < ids[1]
    blocks = mem.start_episodes([3, 1], [TASK, TASK], ["start", "start"])
    assert blocks[0] == blocks[1] and "won in 1 step" in blocks[0]
    with pytest.raises(ValueError, match=re.escape("expected 2 episodes (one per env), got 1")):
        mem.end_episodes([0, 1], [_episode(["up"], won=True)])
    mem.close()


def test_state_dict_round_trips_exactly(tmp_path):
    mem = _mem(
        tmp_path,
        2,
        control="both",
        capacity=3,
        max_history_tokens=500,
        session_id="s",
        retention="persistent",
    )
    _play(mem, 0, ["right"], won=True)
    mem.on_episode_start(0, TASK, "start")
    mem.intercept(0, "<retrieve>right</retrieve>")
    for t in range(5):
        mem.store({"observation": [f"o{t}", f"p{t}"], "action": ["up", "down"]})
    state = mem.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["store"] == {
        "path": str(tmp_path / "episodes.sqlite"),
        "retention": "persistent",
        "namespace": "default",
        "run_id": mem.run_id,
        "session_id": "s",
        "control": "both",
    }
    clone = _mem(
        tmp_path, 2, control="both", capacity=3, max_history_tokens=500, retention="persistent"
    )
    clone.load_state_dict(json.loads(json.dumps(state)))
    assert clone.state_dict() == state and clone.run_id == mem.run_id
    for hl in (0, 1, 3):
        assert clone.fetch(hl) == mem.fetch(hl)
    assert clone.block(0) == mem.block(0) and clone[1] == mem[1]
    assert [clone.num_steps(i) for i in range(2)] == [5, 5]
    with pytest.raises(ValueError, match=re.escape("expected num_envs=3, got 2")):
        _mem(tmp_path, 3).load_state_dict(state)
    with pytest.raises(
        ValueError, match=re.escape("expected retention='single_run', got 'persistent'")
    ):
        _mem(tmp_path, 2, retention="single_run").load_state_dict(state)
    mem.close()
    clone.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"control": "auto"}, "control must be one of ['static', 'agent', 'both'], got 'auto'"),
        (
            {"retention": "forever"},
            "retention must be one of ['single_run', 'session', 'persistent'], got 'forever'",
        ),
        (
            {"retention": "session"},
            "retention='session' needs a session_id (shared by the runs of the session), got None",
        ),
        ({"top_k": 0}, "top_k must be an int >= 1, got 0"),
        ({"min_similarity": 2.0}, "min_similarity must be a number in [0, 1], got 2.0"),
        (
            {"similarity": "bm25"},
            "similarity must be 'lexical', 'embedding:<encoder>' or a callable (query, docs) -> scores, got 'bm25'",
        ),
        ({"max_rows": 0}, "max_rows must be None or an int >= 1, got 0"),
        ({"session_ttl_s": -1}, "session_ttl_s must be None or a number > 0, got -1"),
        (
            {"synchronous": "SOMETIMES"},
            "synchronous must be one of ['OFF', 'NORMAL', 'FULL', 'EXTRA'], got 'SOMETIMES'",
        ),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _mem(tmp_path, **kwargs)


# -- through VectorHistoryWrapper: a past win lets a prompt-only policy solve the map -------------

MAZE = ["SFFFF", "HHHHF", "FFFFF", "FHHHH", "FFFFG"]  # 16 steps: right 4, down 2, left 4, ...


class Wired:
    """The wiring the wrapper is to get, done around it: ``start_episodes`` when episodes start,
    ``end_episodes`` with return and won when they end, ``block(i)`` shown in prompts that have
    no history part (from step 1 on the wrapper's own fetch brings the block)."""

    def __init__(self, venv, memory, episodic: bool) -> None:
        self.env = VectorHistoryWrapper(
            venv, history_length=2, memory=memory, parser=ActionParser()
        )
        self.mem, self.episodic, self.n = memory, episodic, venv.num_envs
        self.returns = np.zeros(self.n)
        self.restart = np.zeros(self.n, dtype=bool)
        self.memory_actions = 0

    def _blocks(self, prompts, info):
        return [
            self.mem.block(i) + "\n\n" + p
            if self.episodic and info["history_steps"][i] == 0 and self.mem.block(i)
            else p
            for i, p in enumerate(prompts)
        ]

    def reset(self, seed):
        prompts, info = self.env.reset(seed=seed)
        if self.episodic:
            self.mem.start_episodes(range(self.n), list(info["task"]), list(info["raw_obs"]))
        return self._blocks(prompts, info)

    def step(self, responses):
        responses = list(responses)
        for i in range(self.n):  # memory actions go to memory; the env gets a no-op
            live = self.episodic and not self.restart[i]
            if live and self.mem.intercept(i, responses[i]) is not None:
                responses[i] = ""
                self.memory_actions += 1
        prompts, rewards, term, trunc, info = self.env.step(responses)
        self.returns += np.where(self.restart, 0.0, rewards)
        ended = np.flatnonzero(info.get("_episode_history", np.zeros(self.n, bool))).tolist()
        if self.episodic and ended:
            eps = [
                {
                    **info["episode_history"][i],
                    "return": self.returns[i],
                    "won": bool(info["won"][i]),
                }
                for i in ended
            ]
            self.mem.end_episodes(ended, eps)
        started = np.flatnonzero(self.restart).tolist()  # NEXT_STEP: reset on the step after done
        if self.episodic and started:
            self.mem.start_episodes(
                started, [info["task"][i] for i in started], [info["raw_obs"][i] for i in started]
            )
        self.returns[started] = 0.0
        wins = [bool(info["won"][i]) and i in ended for i in range(self.n)]
        self.restart = np.logical_or(term, trunc)
        return self._blocks(prompts, info), wins, ended


def replay_policy(prompt: str) -> str:
    """Prompt-only: replay the actions of a won past episode shown in the prompt (the step to
    take comes from the prompt's step count); without one, a naive move (down: a hole here)."""
    plan = re.search(r"\] won in \d+ steps?.*\n\s+Actions \(\d+\): (.*)", prompt)
    if plan is None:
        return "<think>no memory of this lake</think><action>down</action>"
    taken = re.search(r"you have taken (\d+) step", prompt)
    k = int(taken.group(1)) if taken else 0
    actions = plan.group(1).split("; ")
    return f"<think>replay step {k + 1}</think><action>{actions[min(k, len(actions) - 1)]}</action>"


def _run(tmp_path, episodic: bool, steps: int = 60):
    venv = gym.make_vec("agent_memory/FrozenLake-v0", 4, vectorization_mode="sync", desc=MAZE)
    mem = (
        EpisodicMemory(
            4, path=tmp_path / "lake.sqlite", env_name="FrozenLake-v0", retention="single_run"
        )
        if episodic
        else HistoryMemory(4)
    )
    env = Wired(venv, mem, episodic)
    prompts = env.reset(seed=0)
    teacher = venv.envs[0].unwrapped
    taught = False
    wins: list[list[int]] = [[] for _ in range(4)]  # per env: steps of its won episodes
    length = np.zeros(4, dtype=int)
    seen_block_at_step0 = False
    for _ in range(steps):
        responses = [replay_policy(p) for p in prompts]
        if not taught:  # env 0's first episode: a teacher, so that one win exists
            responses[0] = f"<action>{teacher.oracle_action()}</action>"
        prompts, won, ended = env.step(responses)
        length += 1
        for i in ended:
            if won[i]:
                wins[i].append(int(length[i]))
            taught = taught or i == 0
            length[i] = -1  # the next step is the reset step
        seen_block_at_step0 = seen_block_at_step0 or any(
            p.startswith("Past episodes of this task:") for p in prompts
        )
    venv.close()
    return wins, mem, seen_block_at_step0


def test_prompt_only_policy_solves_a_repeated_map_from_a_past_episode(tmp_path):
    wins, mem, block_at_start = _run(tmp_path, episodic=True)
    assert wins[0][0] == 16  # the teacher's episode
    for i in (1, 2, 3):  # students: no win before the teacher's, then shortest wins from memory
        assert len(wins[i]) >= 1 and set(wins[i]) == {16}, wins
    assert block_at_start
    # The recorded history: the students' failures and the wins, with outcome and return.
    rows = mem.store_.rows(mem.scope)
    assert {r.task_key for r in rows} == {mem.task_key(TASK, _first_obs())}
    assert any(r.won is False and r.length == 1 for r in rows)
    assert all(r.won and r.ret == 1.0 for r in rows if r.length == 16)
    mem.close()
    assert mem.store_.count() == 0  # single_run: deleted with the run


def _first_obs() -> str:
    env = gym.make("agent_memory/FrozenLake-v0", desc=MAZE)
    obs, _ = env.reset(seed=0)
    return obs


def test_without_episodic_memory_the_same_policy_never_wins(tmp_path):
    wins, _, _ = _run(tmp_path, episodic=False)
    assert wins[0] == [16] and wins[1:] == [[], [], []]


PATH = "right; right; right; right; down; down; left; left; left; left; down; down; right; right; right; right"


def agent_policy(prompt: str) -> str:
    """Agent control, prompt-only: first ask memory; replay a path found in its reply (the step
    to take: steps taken minus the memory turn); without one, a naive move."""
    found = re.search(r"\[this task, note, [^\]]*\] Path to the goal: (.*)", prompt)
    if found:
        taken = int(re.search(r"you have taken (\d+) step", prompt).group(1))
        path = found.group(1).split("; ")
        return f"<action>{path[min(taken - 1, len(path) - 1)]}</action>"
    if "Memory" in prompt and ("nothing matches" in prompt or "results for" in prompt):
        return "<action>down</action>"
    return "<think>have I been here?</think><retrieve>path to the goal</retrieve>"


def test_agent_control_through_the_wrapper_record_then_retrieve(tmp_path):
    venv = gym.make_vec("agent_memory/FrozenLake-v0", 3, vectorization_mode="sync", desc=MAZE)
    mem = EpisodicMemory(
        3,
        path=tmp_path / "lake.sqlite",
        env_name="FrozenLake-v0",
        control="agent",
        retention="session",
        session_id="s",
    )
    env = Wired(venv, mem, True)
    prompts = env.reset(seed=0)
    assert all(AGENT_INSTRUCTIONS in p for p in prompts)
    teacher = venv.envs[0].unwrapped
    wins, length, t = [[] for _ in range(3)], np.zeros(3, dtype=int), 0
    for t in range(60):
        responses = [agent_policy(p) for p in prompts]
        if t == 0:  # env 0's first turn: a teacher records the path for everyone
            responses[0] = f"<record>Path to the goal: {PATH}</record>"
        elif not wins[0]:
            responses[0] = f"<action>{teacher.oracle_action()}</action>"
        prompts, won, ended = env.step(responses)
        length += 1
        for i in ended:
            if won[i]:
                wins[i].append(int(length[i]))
            length[i] = -1
    assert wins[0][0] == 17  # one memory turn (the note), then the 16 moves
    for i in (1, 2):  # students: retrieve (one memory turn), then replay the note's path
        assert len(wins[i]) >= 2 and set(wins[i]) == {17}, wins
    note = next(r for r in mem.store_.rows() if r.kind == "note")
    assert note.won is True and note.length == 17  # the teacher's episode outcome
    assert env.memory_actions >= 1 + 2 * 2
    venv.close()
    mem.close()
