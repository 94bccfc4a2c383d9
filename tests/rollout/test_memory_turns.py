"""Memory turns: ``memory=compaction`` with ``summarizer=policy`` has the acting policy write the
summary as a turn of its episode (ReSum, CompactionRL). The turn's prompt ids, sampled ids and
log-probs are rows of the episode (``memory_turn``), its answer is the summary the next prompts
show, and it is trained with the advantage of the action it prepares."""

from __future__ import annotations

import json
import re

import pytest

from agent_memory.config import ConfigError, MemoryConfig, PolicyConfig
from agent_memory.memory.compaction import CompactionMemory
from agent_memory.rollout import run_rollout
from agent_memory.rollout.driver.collector import episode_specs
from agent_memory.rollout.driver.preflight import preflight
from agent_memory.rollout.reference import play
from tests.rollout.conftest import make_job

TURNS = {"summarizer": "policy", "trigger_steps": 2, "keep_last": 1}


def _stored(mem: CompactionMemory, n: int) -> None:
    for t in range(1, n + 1):
        mem.store({"observation": [f"Fact {t}."], "action": ["next"]})


def test_the_memory_keeps_its_steps_until_the_policy_writes_the_summary():
    mem = CompactionMemory(num_envs=1, summarizer="policy", trigger_steps=2, keep_last=1)
    _stored(mem, 3)
    [(env, prompt)] = mem.turn_prompts([0]).items()
    assert env == 0 and "New steps 1-2:" in prompt and "Fact 2." in prompt
    assert len(mem[0]) == 3 and mem.summary(0) == ""  # nothing folded before the answer
    assert mem.answer_turns({0: "  facts one and two  "}) == {0: None}
    assert mem.turn_prompts([0]) == {} and len(mem[0]) == 1
    assert mem.fetch(1).contexts[0].startswith("Summary of steps 1-2:\nfacts one and two\n")
    with pytest.raises(ValueError, match=re.escape("env 0 waits for no memory turn")):
        mem.answer_turns({0: "again"})


def test_an_empty_summary_falls_back_to_the_marker_and_says_why():
    mem = CompactionMemory(num_envs=1, summarizer="policy", trigger_steps=2, keep_last=1)
    _stored(mem, 3)
    assert mem.answer_turns({0: " "}) == {0: "the policy wrote an empty summary"}
    assert mem.summary(0) == "[2 earlier steps dropped (steps 1-2)]"
    assert mem.events[-1]["fallback"] == "error"
    _stored(mem, 2)  # due again: a new turn; a reset forgets it
    assert mem.turn_prompts([0]) and (mem.reset(), mem.turn_prompts([0]))[1] == {}


def _job(path, engine: str | None = None):
    job = make_job(
        "agent_memory/Recall-v0",
        policy="hf",
        groups=2,
        size=2,
        workers=1,
        envs=2,
        num_distractors=3,
    )
    job.policy = PolicyConfig(
        name="hf",
        params={
            "path": str(path),
            "max_new_tokens": 5,
            "temperature": 1.0,
            "seed": 0,
            "num_threads": 1,
        },
    )
    job.memory = MemoryConfig(strategy="compaction", params=dict(TURNS))
    job.env.history_length = 2
    if engine is not None:
        job.rollout.mode = engine
    return job


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
    from agent_memory.models import build_tiny_lm

    return build_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny", ["next", "red", "summary"])


@pytest.mark.both_engines
@pytest.mark.usefixtures("ray_session")
def test_memory_turns_are_rows_of_the_episode_in_both_engines(tiny_lm, tmp_path, engine):
    import torch
    from transformers import AutoModelForCausalLM

    job = _job(tiny_lm, engine)
    summary = run_rollout(job, tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").open()]
    turns = [r for r in rows if r["memory_turn"]]
    assert turns and summary["memory_turns"] == len(turns)
    assert summary["env_steps"] == len(rows) - len(turns)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm, local_files_only=True).eval()
    by_episode: dict[str, list[dict]] = {}
    for r in rows:
        by_episode.setdefault(r["traj_uid"], []).append(r)
    for steps in by_episode.values():
        assert [r["step"] for r in steps] == list(range(1, len(steps) + 1))
        for k, r in enumerate(steps):
            if not r["memory_turn"]:
                continue
            nxt = steps[k + 1]  # the action it prepares: it shows the summary, shares its figures
            assert not nxt["memory_turn"] and r["response"].strip() in nxt["prompt"]
            assert (r["advantage"], r["return"], r["reward"]) == (
                nxt["advantage"],
                nxt["return"],
                0.0,
            )
            assert r["prompt"].startswith("You keep a running summary")
            # What the model saw and sampled: teacher forcing reproduces every log-prob.
            ids = r["response_ids"]
            full = torch.tensor([r["prompt_ids"] + ids])
            with torch.no_grad():
                logits = model(full).logits[0].float().log_softmax(-1)
            n = len(r["prompt_ids"])
            want = [logits[n + j - 1, t].item() for j, t in enumerate(ids)]
            assert r["response_logprobs"] == pytest.approx(want, abs=1e-4)
    # The engine plays what the in-process reference loop plays, memory turns included.
    reference = play(_job(tiny_lm), episode_specs(2, 2, job.rollout.seed))
    expected = [(s.step, s.memory_turn, s.response) for t in reference for s in t.steps]
    assert [(r["step"], r["memory_turn"], r["response"]) for r in rows] == expected


def test_a_policy_that_needs_the_envs_fields_cannot_write_the_summary():
    job = make_job("agent_memory/Recall-v0", policy="random", groups=1, size=1, workers=1)
    job.memory = MemoryConfig(strategy="compaction", params=dict(TURNS))
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "memory.params.summarizer=policy has the acting policy write the summary from a prompt "
            "alone, but policy 'random' needs the env's ['admissible_actions'] with every prompt"
        ),
    ):
        preflight(job, probe=False)
