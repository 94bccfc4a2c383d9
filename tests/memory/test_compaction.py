"""CompactionMemory and the summarizers: triggers, summaries, budgets, fallbacks, offloading,
state round trips, and the Recall probe inside VectorHistoryWrapper."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.envs.recall import RecallEnv
from agent_memory.memory import HistoryMemory, available_memories, make_memory
from agent_memory.memory.compaction import (
    CompactionMemory,
    ExtractiveSummarizer,
    FoldedStep,
    LLMSummarizer,
    Summarizer,
    fit_text,
    make_summarizer,
)
from agent_memory.policies import Policy
from agent_memory.tokens import make_token_counter
from agent_memory.wrappers import VectorHistoryWrapper

CUE = "Remember this: the key is RED."


def _store(mem, steps: int, env_ids=None, obs=None) -> None:
    ids = list(range(mem.num_envs)) if env_ids is None else list(env_ids)
    for _ in range(steps):
        t = [mem.num_steps(i) + 1 for i in ids]
        mem.store(
            {
                "observation": [
                    obs(i, s) if obs else f"obs {s} of env {i}.\nSay next."
                    for i, s in zip(ids, t, strict=True)
                ],
                "action": [f"act{s}" for s in t],
            },
            env_ids=ids,
        )


def _steps_in(context: str) -> list[int]:
    return [int(n) for n in re.findall(r"\[Observation (\d+):", context)]


# ---------------------------------------------------------------------------------- folding


def test_fold_keeps_last_steps_verbatim_with_absolute_numbers():
    mem = CompactionMemory(2, trigger_steps=4, keep_last=2)
    _store(mem, 5)
    assert [mem.num_steps(i) for i in range(2)] == [5, 5]
    assert [r["action"] for r in mem[0]] == ["act4", "act5"]
    assert mem.summary_range(0) == (1, 3)
    ctx, lengths = mem.fetch(-1)
    assert lengths == [2, 2]
    assert ctx[0].startswith("Summary of steps 1-3:\n1: obs 1 of env 0. -> act1\n")
    assert _steps_in(ctx[0]) == [4, 5]
    _store(mem, 2)  # 4 held: not more than trigger_steps yet
    assert len(mem[0]) == 4 and len(mem.events) == 2
    _store(mem, 1)  # 5 held: fold 4-6
    assert mem.summary_range(1) == (1, 6)
    assert _steps_in(mem.fetch(-1).contexts[1]) == [7, 8]
    assert "4: obs 4 of env 1. -> act4" in mem.summary(1)
    assert [e["steps_folded"] for e in mem.events] == [3, 3, 3, 3]


def test_history_length_limits_the_verbatim_part_only():
    mem = CompactionMemory(1, trigger_steps=6, keep_last=3)
    _store(mem, 9)  # fold at 7 (steps 1-4), then 5..9 held
    ctx, lengths = mem.fetch(2)
    assert lengths == [2]
    assert ctx[0].startswith("Summary of steps 1-4:")
    assert _steps_in(ctx[0]) == [8, 9]
    assert mem.fetch(0) == ([""], [0])  # 0 = no history at all, summary included


def test_envs_compact_independently_and_reset_clears_summary():
    mem = CompactionMemory(3, trigger_steps=3, keep_last=1)
    _store(mem, 4, env_ids=[0])
    _store(mem, 2, env_ids=[1, 2])
    assert [e["env_id"] for e in mem.events] == [0]
    assert mem.summary(1) == "" and mem.summary_range(1) == (0, 0)
    assert mem.fetch(-1, env_ids=[1]).contexts[0].startswith("[Observation 1:")
    mem.reset(env_ids=[0])
    assert mem.num_steps(0) == 0 and mem.summary(0) == "" and mem.fetch(-1).contexts[0] == ""
    _store(mem, 1, env_ids=[0])
    assert _steps_in(mem.fetch(-1).contexts[0]) == [1]


def test_compaction_happens_at_store_time_never_in_fetch():
    mem = CompactionMemory(4, trigger_steps=5, keep_last=2)
    _store(mem, 5)
    assert mem.events == []
    before = json.dumps(mem.state_dict())
    for _ in range(3):
        mem.fetch(-1)
        mem.fetch(2, max_history_tokens=30)
    assert json.dumps(mem.state_dict()) == before
    _store(mem, 1)
    assert len(mem.events) == 4  # one store folded all four envs (one batched summarizer call)


def test_token_ratio_trigger():
    mem = CompactionMemory(
        1,
        max_history_tokens=200,
        trigger_steps=None,
        trigger_ratio=0.5,
        keep_last=2,
        summary_max_tokens=32,
    )
    # Each step renders to ~30 tokens: the 4th step passes 0.5 * 200 = 100 tokens.
    _store(mem, 3, obs=lambda i, s: f"observation {s} " + "x" * 60)
    assert mem.events == []
    _store(mem, 1, obs=lambda i, s: f"observation {s} " + "x" * 60)
    (event,) = mem.events
    assert event["trigger"] == "tokens" and event["steps_folded"] == 2
    assert event["tokens_before"] > 100 >= event["tokens_after"]
    assert mem.fetch(-1).contexts[0].startswith("Summary of steps 1-2:")


def test_capacity_is_a_hard_trigger():
    mem = CompactionMemory(1, trigger_steps=None, trigger_ratio=None, capacity=3, keep_last=1)
    _store(mem, 10)
    assert len(mem[0]) <= 3
    assert mem.summary_range(0)[1] == 10 - len(mem[0])
    assert {e["trigger"] for e in mem.events} == {"steps"}


def test_events_are_bounded_and_totals_count_everything():
    mem = CompactionMemory(1, trigger_steps=2, keep_last=1, max_events=2)
    _store(mem, 9)  # folds at steps 3, 5, 7, 9
    assert [e["step"] for e in mem.events] == [7, 9]
    assert mem.totals == {"compactions": 4, "fallbacks": 0, "steps_folded": 8}
    assert len(mem.pop_events()) == 2 and mem.events == []
    e = CompactionMemory(1, trigger_steps=2, keep_last=1)
    _store(e, 3)
    keys = set(e.events[0])
    assert keys == {
        "env_id",
        "step",
        "trigger",
        "first_step",
        "last_step",
        "steps_folded",
        "tokens_before",
        "tokens_after",
        "summary_tokens",
        "summarizer",
        "fallback",
        "error",
        "duration_s",
    }


# ---------------------------------------------------------------------------------- budgets


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(1, 30),
    budget=st.integers(0, 400),
    history_length=st.sampled_from([-1, 1, 3, 8]),
)
def test_budget_covers_the_whole_context_and_never_splits_a_step(steps, budget, history_length):
    count = make_token_counter("estimate")
    mem = CompactionMemory(1, trigger_steps=6, keep_last=3, summary_max_tokens=64)
    _store(mem, steps, obs=lambda i, s: f"room {s} " + "y" * (s * 7 % 50))
    ctx, lengths = mem.fetch(history_length, max_history_tokens=budget)
    text = ctx[0]
    assert count(text) <= budget
    numbers = _steps_in(text)
    assert len(numbers) == lengths[0]
    assert re.findall(r"Action (\d+):", text) == [str(n) for n in numbers]  # whole steps
    assert numbers == list(range(steps - len(numbers) + 1, steps + 1))  # the newest ones
    if history_length > 0:
        assert lengths[0] <= history_length
    has_summary = text.startswith("Summary of steps")
    block = (
        mem.fetch(history_length, max_history_tokens=None).contexts[0].split("\n[Observation")[0]
    )
    newest = mem.step_tokens(0)[-1]
    room = count(block + "\n") + (newest if newest <= budget else 0)
    # The newest step first, then the summary, then older steps.
    assert has_summary == (mem.summary_range(0)[1] > 0 and room <= budget)
    if newest <= budget and history_length != 0:
        assert lengths[0] >= 1


def test_summary_that_would_crowd_out_the_newest_step_is_left_out():
    count = make_token_counter("estimate")
    mem = CompactionMemory(1, trigger_steps=3, keep_last=1)
    _store(mem, 4, obs=lambda i, s: f"a long and distinct observation number {s}")
    full = mem.fetch(-1, max_history_tokens=None).contexts[0]
    block, step = full.split("\n[Observation")
    assert block.startswith("Summary")
    both = count(block + "\n") + count("[Observation" + step + "\n")
    assert mem.fetch(-1, max_history_tokens=both).contexts[0] == full
    step_only = mem.fetch(-1, max_history_tokens=both - 1).contexts[0]
    assert not step_only.startswith("Summary") and _steps_in(step_only) == [4]


# ---------------------------------------------------------------------------------- summarizers


def test_extractive_keeps_an_early_cue_dedups_and_merges_runs():
    s = ExtractiveSummarizer()
    steps = [
        FoldedStep(1, observation=f"{CUE}\nSay 'next' to continue.", action="next"),
        FoldedStep(2, observation="You are in a hall.\nSay 'next' to continue.", action="look"),
        FoldedStep(3, observation="You are in a hall.\nSay 'next' to continue.", action="look"),
        FoldedStep(4, observation="You are in a hall.", action="look"),
        FoldedStep(5, observation="You are in a hall.", action="wait"),
    ]
    out = s.summarize("", steps, max_tokens=200)
    assert out.splitlines() == [
        f"1: {CUE} -> next",
        "2: You are in a hall. -> look",
        "3: Say 'next' to continue. -> look",  # the first line not yet in the summary
        "4: -> look",
        "5: -> wait",
    ]
    later = s.summarize(out, [FoldedStep(6, observation="You are in a hall.", action="wait")], 200)
    assert later.splitlines()[-1] == "5-6: -> wait"


def test_extractive_fits_the_budget_by_dropping_the_middle():
    count = make_token_counter("estimate")
    s = make_summarizer("extractive")
    summary = ""
    for start in range(1, 200, 10):  # twenty folds of ten steps each
        steps = [
            FoldedStep(k, observation=CUE if k == 1 else f"Fact number {k}.", action="next")
            for k in range(start, start + 10)
        ]
        summary = s.summarize(summary, steps, 120, count)
        assert count(summary) <= 120
    lines = summary.splitlines()
    assert lines[0] == f"1: {CUE} -> next"  # the head survives
    assert lines[-1] == "200: Fact number 200. -> next"  # and so do the newest lines
    (marker,) = [ln for ln in lines if ln.startswith("[...")]
    kept = len(lines) - 1
    assert marker == f"[... {200 - kept} lines omitted ...]"


def test_extractive_tiny_budget_and_long_lines():
    s = ExtractiveSummarizer(max_line_chars=40)
    long = "First sentence here. " + "word " * 100
    out = s.summarize("", [FoldedStep(1, observation=long, action="go " * 50)], 1000)
    assert out.startswith("1: First sentence here. -> go go")
    assert len(out.splitlines()[0]) < 100
    tiny = s.summarize("", [FoldedStep(1, observation="x" * 500, action="a")], 1)
    assert make_token_counter("estimate")(tiny) <= 1
    offloaded = s.summarize(
        "", [FoldedStep(3, observation="big", action="a", offload_id="obs#3")], 50
    )
    assert offloaded == "3: big [obs#3] -> a"


def test_fit_text():
    count = make_token_counter("chars")
    assert fit_text("short", 10, count) == "short"
    assert fit_text("alpha beta gamma delta", 15, count) == "alpha beta ..."
    assert count(fit_text("x" * 1000, 37, count)) <= 37


class CuePolicy(Policy):
    """A real policy: answers each summarization prompt with the cues it finds in it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def act(
        self, prompts: Sequence[Any], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[str]:
        self.calls.append(list(prompts))
        out = []
        for p in prompts:
            cues = sorted(set(re.findall(r"Remember this: the \w+ is \w+\.", p)))
            out.append("Facts: " + (" ".join(cues) if cues else "none."))
        return out


def test_llm_summarizer_uses_a_real_policy_in_one_batched_call():
    policy = CuePolicy()
    mem = CompactionMemory(
        3, trigger_steps=3, keep_last=1, summarizer=LLMSummarizer(policy), summary_timeout=5
    )
    _store(mem, 1, obs=lambda i, s: f"Remember this: the key is {['RED', 'BLUE', 'GREEN'][i]}.")
    _store(mem, 3)
    assert len(policy.calls) == 1 and len(policy.calls[0]) == 3  # one call for the 3 envs
    prompt = policy.calls[0][1]
    assert "Summary so far (steps before 1):\n(none)" in prompt
    assert "New steps 1-3:" in prompt and "the key is BLUE" in prompt
    assert mem.summary(1) == "Facts: Remember this: the key is BLUE."
    assert mem.events[0]["summarizer"] == "llm" and mem.events[0]["fallback"] is None
    _store(mem, 3)  # the second fold sees the previous summary: the cue carries over
    assert len(policy.calls) == 2
    assert mem.summary(2) == "Facts: Remember this: the key is GREEN."
    assert (
        mem.fetch(1)
        .contexts[2]
        .startswith(
            "Summary of steps 1-6:\nFacts: Remember this: the key is GREEN.\n[Observation 7:"
        )
    )


def test_llm_summarizer_from_config_and_prompt_checks():
    s = make_summarizer({"name": "llm", "policy": {"name": "random", "seed": 0}})
    assert isinstance(s, LLMSummarizer) and s.policy.__class__.__name__ == "RandomPolicy"
    with pytest.raises(ValueError, match=re.escape("summary prompt uses unknown field(s) ['foo']")):
        LLMSummarizer(CuePolicy(), prompt="{foo}")
    with pytest.raises(TypeError, match="needs a Policy"):
        LLMSummarizer(42)


class BlockingPolicy(Policy):
    """A real policy that answers only once released (a hung model server)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def act(self, prompts, meta=None):
        self.release.wait(30)
        return ["late summary"] * len(prompts)


def test_timeout_falls_back_to_truncation_and_never_piles_up_calls():
    policy = BlockingPolicy()
    mem = CompactionMemory(
        1, trigger_steps=3, keep_last=1, summarizer=LLMSummarizer(policy), summary_timeout=0.2
    )
    try:
        _store(mem, 4)
        (event,) = mem.events
        # The 0.2 s deadline fired (its fallback and message; the hung call takes 30 s), and
        # the event's duration is the wait (at least a good part of the deadline).
        assert event["fallback"] == "timeout" and event["duration_s"] > 0.1
        assert "summary_timeout=0.2" in event["error"]
        assert mem.summary(0) == "[3 earlier steps dropped (steps 1-3)]"
        assert (
            mem.fetch(-1)
            .contexts[0]
            .startswith(
                "Summary of steps 1-3:\n[3 earlier steps dropped (steps 1-3)]\n[Observation 4:"
            )
        )
        _store(mem, 3)  # the hung call still runs: no second thread, immediate fallback
        assert mem.events[-1]["fallback"] == "busy"
        assert mem.summary(0).splitlines()[-1] == "[3 earlier steps dropped (steps 4-6)]"
        assert mem.totals["fallbacks"] == 2
        assert not mem.wait_summarizer(timeout=0.01)
    finally:
        policy.release.set()
    assert mem.wait_summarizer(timeout=60)  # the released call ends (60 s: a hang guard only)
    # ... and the summarizer is used again
    _store(mem, 3)
    assert mem.events[-1]["fallback"] is None and mem.summary(0) == "late summary"


class FailingSummarizer(Summarizer):
    may_block = False

    def summarize(self, previous_summary, steps, max_tokens, counter=None):
        raise RuntimeError("model exploded")


def test_summarizer_error_falls_back_and_is_recorded():
    mem = CompactionMemory(1, trigger_steps=2, keep_last=1, summarizer=FailingSummarizer())
    _store(mem, 3)
    (event,) = mem.events
    assert event["fallback"] == "error" and event["error"] == "RuntimeError: model exploded"
    assert event["summarizer"] == "FailingSummarizer"
    assert mem.summary(0) == "[2 earlier steps dropped (steps 1-2)]"
    assert [r["action"] for r in mem[0]] == ["act3"]


# ---------------------------------------------------------------------------------- offloading


def test_large_observations_are_offloaded_and_reloadable():
    big = "BEGIN " + "lorem ipsum " * 500 + "END"
    mem = CompactionMemory(1, trigger_steps=3, keep_last=1, offload_chars=1000, offload_preview=20)
    _store(mem, 3, obs=lambda i, s: big if s == 2 else f"small {s}")
    ctx = mem.fetch(-1).contexts[0]
    assert (
        f"[Observation 2: '[obs#2 offloaded: {len(big):,} chars; preview: BEGIN lorem ipsum lo ...]'"
        in ctx
    )
    assert big not in ctx
    assert mem[0][1]["observation"] == big  # records keep the full text
    assert mem.load_offloaded(0, "obs#2") == big == mem.load_offloaded(0, 2)
    assert mem.offloaded_ids(0) == ["obs#2"]
    with pytest.raises(KeyError, match=re.escape("env 0 has no offloaded observation 'obs#1'")):
        mem.load_offloaded(0, "obs#1")
    _store(mem, 1)  # folds steps 1-3: the offloaded text stays reloadable, the summary cites it
    assert "2: BEGIN lorem ipsum" in mem.summary(0) and "[obs#2]" in mem.summary(0)
    assert mem.load_offloaded(0, "obs#2") == big
    mem.reset()
    assert mem.offloaded_ids(0) == []


def test_offload_capacity_evicts_the_oldest():
    mem = CompactionMemory(1, trigger_steps=10, keep_last=1, offload_chars=10, offload_capacity=2)
    _store(mem, 3, obs=lambda i, s: f"a large observation {s}")
    assert mem.offloaded_ids(0) == ["obs#2", "obs#3"]


def test_set_formatter_rerenders_with_previews():
    big = "z" * 300
    mem = CompactionMemory(1, trigger_steps=3, keep_last=1, offload_chars=100, offload_preview=5)
    _store(mem, 4, obs=lambda i, s: big)
    mem.set_formatter("chat")
    ctx = mem.fetch(-1).contexts[0]
    assert ctx[0]["role"] == "user" and ctx[0]["content"].startswith("Summary of steps 1-3:")
    assert ctx[1] == {"role": "user", "content": "[obs#4 offloaded: 300 chars; preview: zzzzz ...]"}


# ---------------------------------------------------------------------------------- chat, state


@pytest.mark.parametrize("role", ["user", "system"])
def test_chat_formatter_puts_the_summary_first(role):
    mem = CompactionMemory(1, "chat", trigger_steps=3, keep_last=2, summary_role=role)
    _store(mem, 4)
    ctx, lengths = mem.fetch(-1)
    assert lengths == [2]
    assert [m["role"] for m in ctx[0]] == [role, "user", "assistant", "user", "assistant"]
    assert ctx[0][0]["content"].startswith("Summary of steps 1-2:\n1: obs 1 of env 0. -> act1")
    ctx[0][0]["content"] = "mutated"  # callers get copies
    assert mem.fetch(-1).contexts[0][0]["content"].startswith("Summary")


@pytest.mark.parametrize("formatter", ["simple", "chat"])
def test_state_round_trip_mid_episode_is_exact(formatter):
    mem = CompactionMemory(2, formatter, trigger_steps=4, keep_last=2, offload_chars=50)
    _store(mem, 7, obs=lambda i, s: ("L" * 80) if s % 3 == 0 else f"obs {s}")
    _store(mem, 2, env_ids=[1])
    state = json.loads(json.dumps(mem.state_dict()))  # JSON-able
    clone = CompactionMemory(2, formatter, trigger_steps=4, keep_last=2, offload_chars=50)
    clone.load_state_dict(state)
    assert clone.state_dict() == mem.state_dict()
    assert clone.fetch(-1) == mem.fetch(-1) and clone.fetch(2, max_history_tokens=60) == mem.fetch(
        2, max_history_tokens=60
    )
    for m in (mem, clone):  # both continue identically
        _store(m, 5, obs=lambda i, s: f"later {s}")
    assert clone.fetch(-1) == mem.fetch(-1)
    assert [clone.summary(i) for i in range(2)] == [mem.summary(i) for i in range(2)]
    assert [m.load_offloaded(1, "obs#3") for m in (mem, clone)] == ["L" * 80] * 2
    drop = {"duration_s"}
    assert [{k: v for k, v in e.items() if k not in drop} for e in clone.events] == [
        {k: v for k, v in e.items() if k not in drop} for e in mem.events
    ]


def test_load_state_with_another_formatter_rerenders_previews():
    mem = CompactionMemory(1, trigger_steps=4, keep_last=2, offload_chars=50)
    _store(mem, 5, obs=lambda i, s: "Q" * 60)
    chat = CompactionMemory(1, "chat", trigger_steps=4, keep_last=2, offload_chars=50)
    chat.load_state_dict(mem.state_dict())
    ctx = chat.fetch(-1).contexts[0]
    assert ctx[1]["content"].startswith("[obs#4 offloaded: 60 chars")


def test_load_state_refuses_other_kinds():
    hist = HistoryMemory(1)
    mem = CompactionMemory(1)
    with pytest.raises(
        ValueError,
        match=re.escape("cannot load state: expected kind='CompactionMemory', got 'HistoryMemory'"),
    ):
        mem.load_state_dict(hist.state_dict())
    with pytest.raises(
        ValueError, match=re.escape("cannot load state: expected num_envs=1, got 2")
    ):
        mem.load_state_dict(CompactionMemory(2).state_dict())


# ---------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"trigger_steps": 5, "keep_last": 5},
            "keep_last must be < trigger_steps (compaction keeps keep_last steps verbatim and folds the rest once more than trigger_steps are held), got keep_last=5, trigger_steps=5",
        ),
        (
            {"capacity": 3, "keep_last": 5, "trigger_steps": None},
            "keep_last must be < capacity (compaction keeps keep_last steps verbatim and folds the rest once more than capacity are held), got keep_last=5, capacity=3",
        ),
        ({"keep_last": 0}, "keep_last must be an int >= 1, got 0"),
        (
            {"summarizer": "abstractive"},
            "unknown summarizer 'abstractive': expected one of ['extractive', 'llm', 'policy'] (or a Summarizer instance; register yours with agent_memory.memory.compaction.register_summarizer)",
        ),
        (
            {"trigger_steps": None},
            "compaction needs a trigger: set trigger_steps, capacity, or trigger_ratio together with max_history_tokens; got trigger_steps=None, capacity=None, trigger_ratio=0.8, max_history_tokens=None",
        ),
        ({"trigger_ratio": 1.5}, "trigger_ratio must be None or a number in (0, 1], got 1.5"),
        ({"summary_max_tokens": 4}, "summary_max_tokens must be an int >= 16, got 4"),
        (
            {"max_history_tokens": 100, "trigger_ratio": 0.5, "summary_max_tokens": 64},
            "summary_max_tokens must be < trigger_ratio * max_history_tokens (the summary alone would keep the token trigger firing), got summary_max_tokens=64, trigger_ratio * max_history_tokens = 50",
        ),
        ({"summary_timeout": 0}, "summary_timeout must be None or a number > 0, got 0"),
        ({"summary_role": "tool"}, "summary_role must be one of ['user', 'system'], got 'tool'"),
        ({"offload_preview": -1}, "offload_preview must be an int >= 0, got -1"),
        (
            {"summary_header": "{start}"},
            "summary_header may use only {first} and {last}, got '{start}'",
        ),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        CompactionMemory(1, **kwargs)


def test_registered_and_built_from_the_shared_arguments():
    assert "compaction" in available_memories()
    mem = make_memory(
        "compaction",
        num_envs=3,
        formatter="search",
        token_counter="chars",
        max_history_tokens=500,
        capacity=None,
        trigger_steps=8,
        keep_last=3,
        summarizer={"name": "extractive", "max_line_chars": 50},
    )
    assert isinstance(mem, CompactionMemory) and len(mem) == 3
    assert mem.max_history_tokens == 500 and mem.formatter.output == "text"
    assert isinstance(mem.summarizer, ExtractiveSummarizer) and mem.summarizer.max_line_chars == 50


# ---------------------------------------------------------------------------------- Recall


def _recall_success(memory, history_length: int, seeds: int = 40) -> float:
    venv = gym.make_vec(
        "agent_memory/Recall-v0", num_envs=seeds, vectorization_mode="sync", num_distractors=6
    )
    env = VectorHistoryWrapper(venv, history_length=history_length, memory=memory)
    prompts, info = env.reset(seed=list(range(seeds)))
    reward: list[float | None] = [None] * seeds
    for _ in range(10):
        actions = []
        for i, prompt in enumerate(prompts):
            options = list(info["admissible_actions"][i])
            text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
            # A prompt-only oracle: it sees exactly what the model would see.
            actions.append(
                "next" if options == ["next"] else RecallEnv.solve_from_text(text, options)
            )
        prompts, rewards, terminated, truncated, info = env.step(actions)
        for i in np.flatnonzero(terminated | truncated):
            if reward[i] is None:
                reward[i] = float(rewards[i])
        if all(r is not None for r in reward):
            break
    env.close()
    assert all(r is not None for r in reward)
    return float(np.mean(reward))


@pytest.mark.parametrize("formatter", ["simple", "chat"])
def test_recall_solved_through_the_summary_while_the_window_alone_guesses(formatter):
    n = 40
    compaction = make_memory(
        "compaction", num_envs=n, formatter=formatter, trigger_steps=4, keep_last=2
    )
    assert _recall_success(compaction, history_length=2) == 1.0
    assert sum(e["fallback"] is None for e in compaction.events) == len(compaction.events) > 0
    window = HistoryMemory(n, formatter)
    assert _recall_success(window, history_length=2) <= 0.5  # chance is 1/4


def test_inside_the_wrapper_prompts_stay_within_max_prompt_tokens():
    venv = gym.make_vec(
        "agent_memory/Recall-v0", num_envs=4, vectorization_mode="sync", num_distractors=12
    )
    mem = CompactionMemory(4, trigger_steps=4, keep_last=2)
    env = VectorHistoryWrapper(venv, history_length=3, memory=mem, max_prompt_tokens=260)
    env.reset(seed=0)
    summaries = 0
    for _ in range(14):
        prompts, *_, info = env.step(["next"] * 4)
        assert info["context_tokens"].max() <= 260
        assert (info["history_steps"] >= 1).all()  # a summary never crowds out the window
        summaries += sum("Summary of steps 1-" in p for p in prompts)
    env.close()
    assert summaries > 0
