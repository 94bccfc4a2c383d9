"""Every memory strategy runs inside real rollouts (Ray workers, wrappers, hooks wired)."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from agent_memory.config import MemoryConfig
from agent_memory.rollout import run_rollout
from agent_memory.tokens import make_token_counter
from tests.rollout.conftest import make_job

pytestmark = pytest.mark.usefixtures("ray_session")


def recall_job(strategy: str, history_length: int = 2, **params):
    job = make_job(
        "agent_memory/Recall-v0",
        policy="prompt_oracle",
        groups=8,
        size=1,
        workers=1,
        envs=4,
        num_distractors=5,
    )
    job.env.history_length = history_length
    job.memory = MemoryConfig(strategy=strategy, params=params)
    return job


def test_window_alone_cannot_solve_recall_but_retrieval_can(tmp_path):
    window = run_rollout(recall_job("window"), tmp_path / "window")
    retrieval = run_rollout(
        recall_job("retrieval", query_source="explicit"), tmp_path / "retrieval"
    )
    assert window["success_rate"] <= 0.5  # the cue is out of a 2-step window: about chance
    assert retrieval["success_rate"] == 1.0  # the question retrieves the cue's step


def test_compaction_keeps_the_cue_in_its_summary(tmp_path):
    summary = run_rollout(recall_job("compaction", trigger_steps=3, keep_last=1), tmp_path)
    assert summary["success_rate"] == 1.0


def test_conversation_memory_with_chat_prompts(tmp_path):
    job = recall_job("conversation", history_length=-1)
    job.env.formatter = "chat"
    summary = run_rollout(job, tmp_path)
    assert summary["success_rate"] == 1.0 and summary["errors"] == 0


def test_episodic_records_every_episode_in_the_run_database(tmp_path):
    job = make_job(
        "agent_memory/FrozenLake-v0", policy="scripted", groups=3, size=2, workers=2, envs=2
    )
    job.memory = MemoryConfig(
        strategy="episodic",
        params={
            "path": "{output_dir}/episodic.sqlite",
            "retention": "single_run",
            "run_id": "{run_id}",
            "purge_on_close": False,
        },
    )
    summary = run_rollout(job, tmp_path)
    assert summary["success_rate"] == 1.0
    with sqlite3.connect(tmp_path / "episodic.sqlite") as db:
        tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        counts = {t: db.execute(f"select count(*) from {t}").fetchone()[0] for t in tables}
    assert max(counts.values()) == 6  # one row per finished episode, from both workers
    prompts = [line for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert any("Past episodes of this task" in line for line in prompts)


def test_blackboard_notes_are_shared_within_groups_across_workers(tmp_path):
    # One group of 6 on 2 workers x 1 env: three waves, later waves see earlier members' notes.
    job = make_job(
        "agent_memory/Recall-v0",
        policy="scripted",
        groups=1,
        size=6,
        workers=2,
        envs=1,
        num_distractors=1,
    )
    job.memory = MemoryConfig(
        strategy="blackboard", params={"path": "{output_dir}/board.sqlite", "scope": "group"}
    )
    summary = run_rollout(job, tmp_path)
    assert summary["success_rate"] == 1.0
    rows = (tmp_path / "trajectories.jsonl").read_text()
    assert "Shared notes (newest first):" in rows  # later episodes saw earlier members' digests
    with sqlite3.connect(tmp_path / "board.sqlite") as db:
        tables = [r[0] for r in db.execute("select name from sqlite_master where type='table'")]
        notes = max(db.execute(f"select count(*) from {t}").fetchone()[0] for t in tables)
    assert notes == 6  # one digest per finished episode, from both workers


def test_notes_an_expert_writes_carry_every_cue_past_an_empty_window(tmp_path):
    """memory=notes with history_length=0: the prompt is the note and the observation. An expert
    that writes its notes answers every question; the same expert without notes guesses."""

    def job(strategy: str, **policy_params):
        j = make_job(
            "agent_memory/Recall-v0",
            policy="prompt_oracle",
            groups=12,
            size=1,
            workers=1,
            envs=4,
            num_distractors=5,
            num_cues=2,
        )
        j.env.history_length = 0
        j.memory = MemoryConfig(strategy=strategy)
        j.policy.params = policy_params
        return j

    notes_job = job("notes", memory_tag="memory")
    notes = run_rollout(notes_job, tmp_path / "notes")
    window = run_rollout(job("window"), tmp_path / "window")
    assert notes["success_rate"] == 1.0 and notes["memory_flags"] == {}
    assert window["success_rate"] < 0.75  # 4 options and 2 cues: the expert guesses
    rows = [json.loads(line) for line in (tmp_path / "notes" / "trajectories.jsonl").open()]
    assert all(r["prompt"].startswith("Memory:\nRemember this:") for r in rows if r["step"] > 1)
    # Each step's note length (issue 50) counts the note its block wrote (the next prompt's).
    count = make_token_counter(notes_job.memory.token_counter)
    for r in rows:
        block = re.findall(r"<memory>(.*?)</memory>", r["response"], re.DOTALL)[-1].strip()
        assert r["memory_note_tokens"] == count(block) > 0, r
    assert max(r["memory_note_tokens"] for r in rows) <= 64  # note_tokens' default
    windows = [json.loads(line) for line in (tmp_path / "window" / "trajectories.jsonl").open()]
    assert windows and all(r["memory_note_tokens"] is None for r in windows)


def test_notes_flags_are_counted_in_the_summary_and_rows(tmp_path):
    job = make_job(
        "agent_memory/Recall-v0",
        policy="random",
        groups=4,
        size=1,
        workers=1,
        envs=4,
        num_distractors=1,
    )
    job.memory = MemoryConfig(strategy="notes")
    summary = run_rollout(job, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").open()]
    assert summary["memory_flags"] == {"missing": summary["env_steps"]} == {"missing": len(rows)}
    assert {r["memory_flag"] for r in rows} == {"missing"}
    assert {r["memory_note_tokens"] for r in rows} == {0}  # no block, no note
