"""Rows a trainer can learn from: what the model saw and sampled, exactly, in a stable schema.

A tiny word-level causal LM (``agent_memory.models.build_tiny_lm``, random weights, built
offline) plays Recall through the real rollout path (Ray workers, wrappers, memory); every
recorded response token's log-prob is recomputed by teacher forcing with the same model.
"""

from __future__ import annotations

import json
import re

import pytest

from agent_memory.config import PolicyConfig
from agent_memory.protocol import Generation
from agent_memory.rollout import run_rollout
from agent_memory.rollout.driver.groups import Groups
from agent_memory.rollout.driver.layouts import LayoutError, PrefixBroken, episode_samples
from agent_memory.rollout.driver.writer import (
    EPISODE_COLUMNS,
    ROW_COLUMNS,
    RolloutWriter,
    row_schema,
)
from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
from tests.rollout.conftest import make_job

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("transformers", reason="the 'llm' extra is not installed")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from agent_memory.models import build_tiny_lm, words_from_texts

    texts = [
        "Remember this : the balloon is RED BLUE GREEN BROWN . Answer with <action> </action>",
        "What color was the balloon ? next red blue green brown admissible actions are",
    ]
    return build_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny", words_from_texts(texts))


def _hf_job(path, **rollout):
    job = make_job(
        "agent_memory/Recall-v0",
        policy="hf",
        groups=2,
        size=2,
        workers=1,
        envs=4,
        num_distractors=1,
    )
    job.policy = PolicyConfig(
        name="hf",
        params={
            "path": str(path),
            "max_new_tokens": 6,
            "temperature": 1.0,
            "seed": 0,
            "num_threads": 1,
        },
    )
    job.env.max_steps = 3
    for key, value in rollout.items():
        setattr(job.rollout, key, value)
    return job


@pytest.mark.usefixtures("ray_session")
def test_step_rows_hold_what_the_hf_policy_sampled(tiny_lm, tmp_path):
    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM

    summary = run_rollout(_hf_job(tiny_lm), tmp_path)
    assert summary["status"] == "ok"
    table = pq.read_table(tmp_path / "trajectories.parquet")
    assert table.schema.equals(row_schema())
    rows = table.to_pylist()
    assert rows and len(rows) == summary["env_steps"]
    model = AutoModelForCausalLM.from_pretrained(tiny_lm, local_files_only=True).eval()
    for r in rows:
        ids, lps = r["response_ids"], r["response_logprobs"]
        assert r["prompt_ids"] and ids and len(ids) == len(lps) == len(r["response_mask"])
        assert set(r["response_mask"]) == {1}
        assert r["context_tokens"] == len(r["prompt_ids"])  # the real prompt length
        assert r["finish_reason"] in ("stop", "length") and r["policy_version"] == 0
        assert r["temperature"] == 1.0 and r["sampling_seed"] == 0
        # Teacher forcing: one forward pass over prompt + response, at the sampling
        # temperature (1.0, no top-k/top-p), reproduces every recorded log-prob (1e-4, fp32).
        full = torch.tensor([r["prompt_ids"] + ids])
        with torch.no_grad():
            logits = model(full).logits[0].float().log_softmax(-1)
        n = len(r["prompt_ids"])
        want = [logits[n + j - 1, t].item() for j, t in enumerate(ids)]
        assert lps == pytest.approx(want, abs=1e-4)


@pytest.mark.usefixtures("ray_session")
def test_the_schema_is_the_same_when_the_token_columns_are_all_null(tmp_path):
    import pyarrow.parquet as pq

    job = make_job(
        "agent_memory/Recall-v0",
        policy="random",
        groups=1,
        size=2,
        workers=1,
        envs=2,
        num_distractors=1,
    )
    run_rollout(job, tmp_path)
    table = pq.read_table(tmp_path / "trajectories.parquet")
    assert table.schema.equals(row_schema())  # list<int64> even with no value in the column
    assert table.column("response_ids").null_count == table.num_rows
    datasets = pytest.importorskip("datasets", reason="datasets is not installed")
    loaded = datasets.load_dataset(
        "parquet", data_files=str(tmp_path / "trajectories.parquet"), split="train"
    )
    assert loaded.num_rows == table.num_rows and "prompt_ids" in loaded.column_names
    first = json.loads((tmp_path / "trajectories.jsonl").read_text().splitlines()[0])
    assert set(first) == set(ROW_COLUMNS)  # every column documented, none left out


def _steps(*turns):
    """An episode whose turn k has log-prob -k/4 on each response token and advantage 0.5."""
    steps = []
    for k, (prompt, response) in enumerate(turns, start=1):
        g = Generation(
            "", prompt_ids=prompt, response_ids=response, response_logprobs=[-k / 4] * len(response)
        )
        steps.append(
            StepRecord(
                k,
                "",
                "",
                None,
                True,
                None,
                1.0,
                k == len(turns),
                False,
                len(prompt),
                0,
                0,
                None,
                generation=g,
                advantage=0.5,
            )
        )
    return Trajectory(EpisodeSpec("g0", "g0-t0", 0, 0, 1), steps, won=True)


def test_an_append_only_episode_is_one_sample_that_masks_the_env_tokens():
    [s] = episode_samples(
        _steps(([1, 2], [3, 9]), ([1, 2, 3, 9, 4, 4], [5, 9]), ([1, 2, 3, 9, 4, 4, 5, 9, 6], [7]))
    )
    assert (s.segment, s.segments, s.first_turn, s.turns) == (0, 1, 1, 3)
    assert s.prompt_ids == [1, 2]
    assert s.completion_ids == [3, 9, 4, 4, 5, 9, 6, 7]
    assert s.completion_mask == [1, 1, 0, 0, 1, 1, 0, 1]
    assert s.completion_logprobs == [-0.25, -0.25, 0.0, 0.0, -0.5, -0.5, 0.0, -0.75]
    assert s.token_advantages == [0.5, 0.5, 0.0, 0.0, 0.5, 0.5, 0.0, 0.5]
    assert s.episode_return == 3.0 and set(s.row()) == set(EPISODE_COLUMNS)
    # Every turn's prompt is a prefix of prompt_ids + completion_ids (the property itself).
    whole = s.prompt_ids + s.completion_ids
    for prompt in ([1, 2], [1, 2, 3, 9, 4, 4], [1, 2, 3, 9, 4, 4, 5, 9, 6]):
        assert whole[: len(prompt)] == prompt


def test_a_prompt_that_memory_rewrote_starts_a_new_segment():
    # Turn 3's prompt restarts (a summary, a note): turns 1-2 and 3-4 are two samples.
    t = _steps(([1, 2], [3, 9]), ([1, 2, 3, 9, 4], [5]), ([1, 6], [7, 9]), ([1, 6, 7, 9, 8], [5]))
    t.steps[2].advantage = 0.25  # token advantages are each step's; `advantage` the episode's
    first, second = episode_samples(t, strict=False)
    assert [(s.segment, s.segments, s.first_turn, s.turns) for s in (first, second)] == [
        (0, 2, 1, 2),
        (1, 2, 3, 2),
    ]
    assert (first.prompt_ids, first.completion_ids) == ([1, 2], [3, 9, 4, 5])
    assert first.completion_mask == [1, 1, 0, 1]
    assert first.completion_logprobs == [-0.25, -0.25, 0.0, -0.5]
    assert (second.prompt_ids, second.completion_ids) == ([1, 6], [7, 9, 8, 5])
    assert second.completion_mask == [1, 1, 0, 1]
    assert second.completion_logprobs == [-0.75, -0.75, 0.0, -1.0]
    assert second.token_advantages == [0.25, 0.25, 0.0, 0.5]
    assert first.advantage == second.advantage == 0.5 and second.episode_return == 4.0
    assert second.policy_versions == [None, None] and set(second.row()) == set(EPISODE_COLUMNS)


def test_each_segment_carries_the_tokens_that_write_the_memory():
    """Issue 47: episode samples had no memory_mask. A turn's own (a <memory> block's tokens,
    ``memory=notes``), all of a memory turn's (a summary the policy wrote), 0 on env tokens."""
    t = _steps(([1, 2], [3, 9]), ([1, 2, 3, 9, 4], [5, 6]), ([7], [8, 8]), ([1, 6], [5]))
    t.steps[0].memory_mask, t.steps[1].memory_mask = [1, 0], [0, 1]
    t.steps[2].memory_turn, t.steps[3].memory_mask = True, [0]
    first, turn, last = episode_samples(t, strict=False)
    assert first.completion_ids == [3, 9, 4, 5, 6] and first.memory_mask == [1, 0, 0, 0, 1]
    assert (turn.memory_mask, last.memory_mask) == ([1, 1], [0])
    t.steps[3].memory_mask = None  # a turn that does not say: unknown where blocks are read
    assert episode_samples(t, strict=False)[2].memory_mask is None
    assert episode_samples(t, strict=False, blocks=False)[2].memory_mask == [0]


def test_a_broken_prefix_raises_where_the_chat_only_grows():
    with pytest.raises(
        PrefixBroken,
        match=re.escape(
            "episode g0-t0: turn 2's prompt does not start with turn 1's prompt and response "
            "(first difference at token 2: 3 in the context vs 8 in the prompt)"
        ),
    ):
        episode_samples(_steps(([1, 2], [3, 9]), ([1, 2, 8, 9, 4], [5, 9])))


def test_steps_without_token_ids_refuse_the_episode_layout():
    t = _steps(([1, 2], [3, 9]))
    t.steps[0].generation = Generation("up")
    with pytest.raises(
        LayoutError,
        match=re.escape(
            "rollout.layout=episode needs the token ids and log-probs of every turn, but step 1 "
            "of episode g0-t0 has none: use a policy that samples tokens"
        ),
    ):
        episode_samples(t, strict=False)


@pytest.mark.parametrize("grows", [True, False], ids=["append-only", "rewriting"])
def test_a_broken_prefix_drops_the_sample_only_where_the_chat_only_grows(tmp_path, grows):
    job = make_job("agent_memory/Recall-v0", groups=1, size=2)
    job.rollout.layout = "episode"
    if grows:  # the whole history in the model's own chat: one sample per episode
        job.env.history_length, job.env.formatter = -1, "transcript"
    good = _steps(([1, 2], [3, 9]), ([1, 2, 3, 9, 4], [5]))
    bad = _steps(([1, 2], [3, 9]), ([1, 2, 8, 9, 4], [5]))  # e.g. cut to fit a context
    bad.spec = EpisodeSpec("g0", "g0-t1", 0, 1, 1)
    writer = RolloutWriter(tmp_path, job)
    groups = Groups(job.rollout.group_size, job.algo, on_group=writer.add_group)
    groups.add(good)
    groups.add(bad)
    writer.close({"status": "ok"})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "ok"
    episodes = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    samples = [(e["traj_uid"], e["segment"], e["segments"]) for e in episodes]
    if grows:
        [error] = summary["episode_layout_errors"]
        assert error["traj_uid"] == "g0-t1" and "turn 2's prompt does not start" in error["error"]
        assert samples == [("g0-t0", 0, 1)]
    else:
        assert not summary["episode_layout_errors"]
        assert samples == [("g0-t0", 0, 1), ("g0-t1", 0, 2), ("g0-t1", 1, 2)]
    steps = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(steps) == 4  # every step row of both episodes is kept


@pytest.mark.usefixtures("ray_session")
def test_a_sliding_window_splits_each_episode_into_the_turns_the_model_saw(tiny_lm, tmp_path):
    # A window of one step in the model's own chat: turn 2 extends turn 1, turn 3 drops turn 1.
    job = _hf_job(tiny_lm, layout="episode")
    job.policy.params["incremental"] = True
    job.env.history_length, job.env.formatter = 1, "transcript"
    summary = run_rollout(job, tmp_path)
    assert summary["status"] == "ok" and not summary["episode_layout_errors"]
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (tmp_path / "episodes.jsonl").read_text().splitlines()]
    for uid in {r["traj_uid"] for r in rows}:
        steps = sorted((r for r in rows if r["traj_uid"] == uid), key=lambda r: r["step"])
        segments = sorted((s for s in samples if s["traj_uid"] == uid), key=lambda s: s["segment"])
        assert len(steps) == 3  # turns 1-2 are one sample, turn 3 (turn 1 dropped) another
        got = [(s["segment"], s["segments"], s["first_turn"], s["turns"]) for s in segments]
        assert got == [(0, 2, 1, 2), (1, 2, 3, 1)]
        for s in segments:
            turns = steps[s["first_turn"] - 1 : s["first_turn"] - 1 + s["turns"]]
            full = s["prompt_ids"] + s["completion_ids"]
            mask = [0] * len(s["prompt_ids"]) + s["completion_mask"]
            logprobs = [0.0] * len(s["prompt_ids"]) + s["completion_logprobs"]
            end = 0
            for r in turns:  # each turn: its prompt is what came before, then its response
                start, n = len(r["prompt_ids"]), len(r["response_ids"])
                assert full[:start] == r["prompt_ids"] and start >= end
                assert full[start : start + n] == r["response_ids"]
                assert mask[end:start] == [0] * (start - end) and mask[start : start + n] == [1] * n
                assert logprobs[start : start + n] == r["response_logprobs"]
                end = start + n
            assert end == len(full)
            if s["segment"]:  # it starts where the previous turn's context was rewritten
                last = steps[s["first_turn"] - 2]
                context = last["prompt_ids"] + last["response_ids"]
                assert s["prompt_ids"][: len(context)] != context
