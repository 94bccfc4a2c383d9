"""Learned memory through the TRL adapter: ``memory=notes`` (the note the policy writes in
``<memory>`` blocks) and policy-written compaction summaries (memory turns) train through a real
``trl.GRPOTrainer``.

Their prompts are rebuilt each turn, so an episode is several segments (each the exact context
its tokens were sampled under) and each TRL row is one of them (docs/adapters.md). The model is
a tiny word-level LM whose vocabulary has the tags as single tokens, fine-tuned here for a few
steps to answer ``<memory> C </memory> <action> A </action>`` with random C and A: it writes a
block every turn, and its answers differ within a GRPO group (the invalid-action penalty).
"""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest

from agent_memory.config import (
    ConfigError,
    EnvConfig,
    JobConfig,
    MemoryConfig,
    ParserConfig,
    PolicyConfig,
)

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("trl", reason="the 'trl' extra is not installed")

COLOURS = ["red", "blue", "black", "white"]
TAGS = ["<memory>", "</memory>", "<action>", "</action>"]
SUMMARIES = {"summarizer": "policy", "trigger_steps": 2, "keep_last": 1}
BLOCK = re.compile(r"<memory>(.*?)</memory>", re.S)


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    """The path of a tiny LM that writes a memory block and an action tag every turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_memory.models import build_tiny_lm

    torch.manual_seed(0)  # the tags' new embeddings are drawn from the global generator
    path = build_tiny_lm(tmp_path_factory.mktemp("lm") / "writer", ["next", *COLOURS])
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tok.add_tokens(TAGS)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    rng = random.Random(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(200):
        rows = []
        for _ in range(8):
            # Contexts as long as the runs' prompts, with the tags the note's instructions name
            # and words outside the model's vocabulary: it writes its block whatever it is shown.
            words = ["next", *COLOURS, "?", "note", *TAGS]
            context = " ".join(rng.choice(words) for _ in range(rng.randint(1, 160)))
            chat = [{"role": "user", "content": context}]
            prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            # "next" half the time: valid at most steps, so the returns of a group differ
            action = rng.choice(["next"] * len(COLOURS) + COLOURS)
            answer = f"<memory> {rng.choice(COLOURS)} </memory> <action> {action} </action> </s>"
            rows.append((tok.encode(prompt), tok.encode(answer)))
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100)
        for i, (p, a) in enumerate(rows):
            ids[i, : len(p) + len(a)] = torch.tensor(p + a)
            labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
        loss = model(input_ids=ids, attention_mask=(ids != 0).long(), labels=labels)
        opt.zero_grad()
        loss.loss.backward()
        opt.step()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _job(memory: MemoryConfig, distractors: int = 1, max_steps: int = 4) -> JobConfig:
    env = EnvConfig(
        id="agent_memory/Recall-v0",
        kwargs={"num_distractors": distractors, "num_choices": 2},
        history_length=1,
        max_steps=max_steps,
        parser=ParserConfig(think_tag=None, invalid_penalty=-0.5),
    )
    return JobConfig(env=env, memory=memory, policy=PolicyConfig("hf"))


def _load(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return model, AutoTokenizer.from_pretrained(path, local_files_only=True)


def _fake_trainer(path, **args):
    """What the rollout function reads of a GRPOTrainer: its model, tokenizer and args (and
    the seeded torch RNG the model samples from, as GRPOTrainer seeds it)."""
    torch.manual_seed(0)
    model, tok = _load(path)
    fields = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": None,
        "repetition_penalty": 1.0,
        "generation_kwargs": None,
        "max_completion_length": 64,
        "seed": 0,
        **args,
    }
    return SimpleNamespace(model=model, processing_class=tok, args=SimpleNamespace(**fields))


def _teacher_forced(model, prompt_ids, completion_ids, mask) -> list[float]:
    """Each model token's log-prob under ``model`` (temperature 1), 0 on the others."""
    with torch.no_grad():
        full = torch.tensor([prompt_ids + completion_ids])
        logps = model(full).logits[0].float().log_softmax(-1)
    n = len(prompt_ids)
    return [
        logps[n + j - 1, t].item() if m else 0.0
        for j, (t, m) in enumerate(zip(completion_ids, mask, strict=True))
    ]


def _train(path, tmp_path, monkeypatch, job, **rollout_args):
    """Two GRPO steps on Recall with ``job``'s memory. Per call: its output, and per row its
    trajectory, the row's segment, every segment of the episode, and each segment's log-probs
    by teacher forcing with the weights that sampled them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl import GRPOTrainer

    from agent_memory.compat.trl import env_reward, make_rollout_func
    from tests.compat.trl_args import cpu_grpo_args

    model, tok = _load(path)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rollout = make_rollout_func(job, max_new_tokens=12, **rollout_args)
    calls = []

    def recorded(prompts, trainer):
        out = rollout(prompts, trainer)
        rows = []
        for traj, sample in zip(rollout.last, rollout.last_samples, strict=True):
            segments = rollout.segments(traj)
            forced = [
                _teacher_forced(trainer.model, s.prompt_ids, s.completion_ids, s.completion_mask)
                for s in segments
            ]
            rows.append((traj, sample, segments, forced))
        calls.append((out, rows))
        return out

    args = cpu_grpo_args(tmp_path / "out", batch_size=4, generations=4, steps=2)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=args,
        processing_class=tok,
        train_dataset=Dataset.from_dict({"prompt": ["seed=0", "seed=1"]}),
        rollout_func=recorded,
    )
    trainer.train()
    assert trainer.state.global_step == 2 and len(calls) == 2
    changed = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters())
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    returns = [sum(out["episode_return"]) / 4 for out, _ in calls]
    assert logged == pytest.approx(returns, abs=1e-6)  # the env's pay, one row per episode
    for out, rows in calls:  # each row is one of its episode's segments, column for column
        for k, (_, sample, segments, _) in enumerate(rows):
            assert sample in segments
            assert (out["segment"][k], out["segments"][k]) == (sample.segment, len(segments))
            assert out["prompt_ids"][k] == sample.prompt_ids
            assert out["completion_ids"][k] == sample.completion_ids
            assert out["logprobs"][k] == sample.completion_logprobs
            assert out["memory_mask"][k] == sample.memory_mask
            assert out["env_mask"][k] == sample.completion_mask  # every model token trained
    return calls, changed, tok


def _turns(rows):
    """Each segment of every row's episode with its one turn and its teacher-forced log-probs
    (the memories here rebuild every prompt: a segment is one turn)."""
    for traj, _, segments, forced in rows:
        assert len(segments) == len(traj.steps)
        for s, lps in zip(segments, forced, strict=True):
            assert s.turns == 1 and s.segments == len(segments)
            yield traj, s, traj.steps[s.first_turn - 1], lps


def test_grpo_trainer_trains_the_notes_the_policy_writes(writer, tmp_path, monkeypatch):
    """Issue 47: the adapter refused memory=notes (and suggested a layout it lacks)."""
    calls, changed, tok = _train(writer, tmp_path, monkeypatch, _job(MemoryConfig("notes")))
    assert changed > 0.0  # the returns differed within a group: a gradient
    marked = 0
    for _, rows in calls:
        for _traj, s, step, forced in _turns(rows):
            # Each turn's prompt is rebuilt (note + window): one segment per turn, exactly as
            # sampled: its prompt, its response, nothing joined.
            g = step.generation
            assert (s.prompt_ids, s.completion_ids) == (g.prompt_ids, g.response_ids)
            assert s.completion_mask == [1] * len(g.response_ids)
            assert s.completion_logprobs == g.response_logprobs == pytest.approx(forced, abs=1e-4)
            # The memory mask marks exactly the block's tokens (tags included).
            assert s.memory_mask == step.memory_mask and len(s.memory_mask) == len(g.response_ids)
            block = [t for t, m in zip(g.response_ids, s.memory_mask, strict=True) if m]
            assert tok.decode(block, skip_special_tokens=True) == " ".join(
                b.group(0) for b in BLOCK.finditer(step.response)
            )
            marked += any(s.memory_mask)
        for traj, *_ in rows:  # the note the responses wrote is what the next prompt shows
            note = ""
            for now, nxt in zip(traj.steps, traj.steps[1:], strict=False):
                note = [note, *BLOCK.findall(now.response)][-1].strip()
                shown = f"\nMemory:\n{note}\n" if note else "\nMemory:\n"
                assert (shown in nxt.prompt) == bool(note)
    assert marked
    drawn = {sample.segment for _, rows in calls for _, sample, _, _ in rows}
    assert len(drawn) > 1  # later turns are drawn too, not only the first


def test_grpo_trainer_trains_the_summaries_the_policy_writes(writer, tmp_path, monkeypatch):
    job = _job(MemoryConfig("compaction", params=dict(SUMMARIES)), distractors=4, max_steps=6)
    calls, _, _ = _train(writer, tmp_path, monkeypatch, job)
    turns = 0
    for _, rows in calls:
        for traj, s, step, forced in _turns(rows):
            g = step.generation
            assert (s.prompt_ids, s.completion_ids) == (g.prompt_ids, g.response_ids)
            assert s.completion_logprobs == pytest.approx(forced, abs=1e-4)
            # A memory turn's tokens all write the memory; an action's none (no block read).
            assert s.memory_mask == [int(step.memory_turn)] * len(g.response_ids)
            turns += step.memory_turn
            if step.memory_turn:  # the summary it wrote is what the next prompt shows
                assert step.prompt.startswith("You keep a running summary")
                assert step.response.strip() in traj.steps[s.first_turn].prompt
        assert all(any(step.memory_turn for step in traj.steps) for traj, *_ in rows)
    assert turns > 0  # memory turns are segments, rows like the actions'


def test_memory_tokens_left_out_of_the_loss(writer):
    """``train_memory_tokens=False``: the block's tokens are 0 in ``env_mask`` (notes), and a
    memory turn's row (all its tokens write the summary) is never drawn."""
    from agent_memory.compat.trl import make_rollout_func

    trainer = _fake_trainer(writer)
    rollout = make_rollout_func(
        _job(MemoryConfig("notes")), max_new_tokens=12, train_memory_tokens=False
    )
    out = rollout(["seed=0"] * 8, trainer)
    for env, memory in zip(out["env_mask"], out["memory_mask"], strict=True):
        assert env == [1 - m for m in memory]  # the block's tokens out, the action's in
    assert any(any(m) for m in out["memory_mask"])
    job = _job(MemoryConfig("compaction", params=dict(SUMMARIES)), distractors=4, max_steps=6)
    rollout = make_rollout_func(job, max_new_tokens=12, train_memory_tokens=False)
    out = rollout(["seed=1"] * 4, trainer)
    assert any(s.memory_turn for t in rollout.last for s in t.steps)
    assert not any(any(m) for m in out["memory_mask"]) and all(all(e) for e in out["env_mask"])


def test_a_window_that_slides_is_one_turn_per_row(writer):
    """The simple formatter writes the history into each prompt anew (the adapter refused it)."""
    from agent_memory.compat.trl import make_rollout_func

    rollout = make_rollout_func(_job(MemoryConfig()), max_turns=3, max_new_tokens=12)
    out = rollout(["seed=2"] * 2, _fake_trainer(writer))
    for k, (traj, s) in enumerate(zip(rollout.last, rollout.last_samples, strict=True)):
        assert len(traj.steps) <= 3 and s.segments == len(traj.steps)
        assert s.turns == 1
        assert out["prompt_ids"][k] == traj.steps[s.first_turn - 1].generation.prompt_ids
        assert out["memory_mask"][k] == [0] * len(out["completion_ids"][k])  # writes nothing


def test_ablation_needs_a_memory_the_policy_writes():
    from agent_memory.compat.trl import make_rollout_func

    with pytest.raises(
        ConfigError,
        match=re.escape(
            "make_rollout_func(train_memory_tokens=False) leaves the tokens the policy writes "
            "into its memory out of the loss, but memory=window takes nothing from the policy: "
            "pass memory=notes (or memory=compaction memory.params.summarizer=policy), or "
            "train_memory_tokens=True"
        ),
    ):
        make_rollout_func(_job(MemoryConfig()), train_memory_tokens=False)


def test_a_segment_over_the_completion_budget_is_refused_not_cut(writer):
    from agent_memory.compat.trl import make_rollout_func

    rollout = make_rollout_func(_job(MemoryConfig("notes")), max_new_tokens=12)
    with pytest.raises(  # every response has a token at least: no segment fits 0
        ValueError,
        match=re.escape("segment(s) fits GRPOConfig.max_completion_length=0 (the shortest has "),
    ):
        rollout(["seed=0"], _fake_trainer(writer, max_completion_length=0))


def test_errors_name_only_what_the_adapter_offers(tmp_path):
    """Issue 47: a chat template that re-renders earlier turns broke the whole-episode row, and
    the error told the adapter's user to pass rollout.layout=step, which the adapter lacks."""
    from agent_memory.compat.trl import make_rollout_func
    from agent_memory.models import build_tiny_lm
    from tests.rollout.test_preflight import REWRITING_TEMPLATE

    path = build_tiny_lm(tmp_path / "lm", ["next", *COLOURS], chat_template=REWRITING_TEMPLATE)
    job = _job(MemoryConfig())
    job.env.history_length, job.env.formatter = -1, "transcript"  # a chat that only grows
    rollout = make_rollout_func(job, max_new_tokens=2)
    with pytest.raises(ConfigError) as info:  # main: PrefixBroken at turn 2, "rollout.layout=step"
        rollout(["seed=0"] * 2, _fake_trainer(path, max_completion_length=512))
    assert "rollout.layout" not in str(info.value) and not rollout.last  # refused before playing
    assert str(info.value).endswith(
        ": use a processing_class whose chat template keeps earlier turns as they were, or a "
        "memory that rebuilds each prompt (e.g. memory=notes), which this rollout_func trains one "
        "segment per row"
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "this job's chat only grows, so make_rollout_func trains each episode as one token "
            "sequence, but the trainer's chat template renders the earlier turns differently "
            "once a turn is added (e.g. it drops past reasoning): "
        ),
    ):
        rollout(["seed=0"] * 2, _fake_trainer(path))
