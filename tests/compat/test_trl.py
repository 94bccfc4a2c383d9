"""A real ``trl.GRPOTrainer`` trains through ``agent_memory.compat.trl.make_rollout_func``.

A tiny word-level LM (random weights, built offline in the test) plays Recall in whole-episode
chats (``transcript`` formatter, ``history_length=-1``: the ``episode`` layout) on CPU. The
vocabulary is the env's few action words, and a response is one token (``max_new_tokens=1``,
no tags), so some answers are admissible and others are not: the invalid-action penalty makes
returns differ within a GRPO group, so the advantages, the gradient and the update are not zero.
"""

from __future__ import annotations

import re

import pytest

from agent_memory.config import (
    EnvConfig,
    JobConfig,
    MemoryConfig,
    ParserConfig,
    PolicyConfig,
    TemplateConfig,
)

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("trl", reason="the 'trl' extra is not installed")

WORDS = ["next", "red", "blue", "green", "brown"]


def _job(**env: object) -> JobConfig:
    settings = dict(
        id="agent_memory/Recall-v0",
        kwargs={"num_distractors": 1, "num_choices": 2},
        history_length=-1,
        formatter="transcript",
        max_steps=4,
        template=TemplateConfig(no_history="{observation}"),
        parser=ParserConfig(tag=None, think_tag=None, invalid_penalty=-0.5),
    )
    settings.update(env)
    return JobConfig(env=EnvConfig(**settings), memory=MemoryConfig(), policy=PolicyConfig("hf"))


def _replay(job: JobConfig, traj) -> float:
    """The return a fresh env pays for the trajectory's responses, from its seed."""
    import gymnasium as gym

    from agent_memory.wrappers import HistoryWrapper

    env = HistoryWrapper(
        gym.make(job.env.id, max_episode_steps=job.env.max_steps, **job.env.kwargs),
        history_length=-1,
        formatter="transcript",
        template=job.env.template.build(),
        parser=job.env.parser.build(),
    )
    env.reset(seed=traj.spec.seed)
    total = 0.0
    for step in traj.steps:
        _, reward, *_ = env.step(step.response)
        total += float(reward)
    env.close()
    return total


def test_grpo_trainer_learns_from_our_episodes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from agent_memory.compat.trl import env_reward, make_rollout_func
    from agent_memory.models import build_tiny_lm
    from tests.compat.trl_args import cpu_grpo_args

    path = build_tiny_lm(tmp_path / "lm", WORDS, init_range=0.02)  # near-uniform sampling
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    job = _job()
    rollout = make_rollout_func(job, max_new_tokens=1)
    calls = []

    def recorded(prompts, trainer):
        out = rollout(prompts, trainer)
        calls.append((list(prompts), out, rollout.last))
        return out

    args = cpu_grpo_args(tmp_path / "out", batch_size=8, generations=4, steps=2)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": [f"seed={i}" for i in range(4)]}),
        rollout_func=recorded,
    )
    trainer.train()

    assert trainer.state.global_step == 2 and len(calls) == 2  # one generation batch per step
    changed = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters())
    assert changed > 0.0
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2
    for entry, (prompts, out, trajs) in zip(logged, calls, strict=True):
        # TRL repeats each prompt num_generations times, consecutively; one row comes back each.
        assert prompts[0::4] == prompts[1::4] == prompts[2::4] == prompts[3::4]
        assert len(out["prompt_ids"]) == len(trajs) == len(prompts) == 8
        returns = out["episode_return"]
        assert returns == [t.episode_return for t in trajs]
        assert [_replay(job, t) for t in trajs] == pytest.approx(returns)  # the env's own pay
        assert entry["reward"] == pytest.approx(sum(returns) / len(returns), abs=1e-6)
        for ids, comp, mask, lps, traj in zip(
            out["prompt_ids"],
            out["completion_ids"],
            out["env_mask"],
            out["logprobs"],
            trajs,
            strict=True,
        ):
            assert len(comp) == len(mask) == len(lps) <= args.max_completion_length
            whole = ids + comp
            sampled = [t for t, m in zip(comp, mask, strict=True) if m]
            assert sampled == [t for s in traj.steps for t in s.generation.response_ids]
            for s in traj.steps:  # the prefix property: every turn saw the row's tokens
                g = s.generation
                assert whole[: len(g.prompt_ids) + len(g.response_ids)] == (
                    g.prompt_ids + g.response_ids
                )
    assert any(
        len(set(out["episode_return"][k : k + 4])) > 1 for _, out, _ in calls for k in (0, 4)
    )


def test_episodes_stop_before_they_overflow_the_completion_budget(tmp_path, monkeypatch):
    """With a small ``max_completion_length`` an episode is cut between turns (never a prompt
    truncated by the model's context), and the row still holds every token the model saw."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agent_memory.compat.trl import env_reward, make_rollout_func
    from agent_memory.models import build_tiny_lm

    path = build_tiny_lm(tmp_path / "lm", WORDS, init_range=0.02, context=64)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    rollout = make_rollout_func(_job(max_steps=10), max_new_tokens=1)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=24,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=args,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": ["seed=0"]}),
        rollout_func=rollout,
    )
    out = rollout(["seed=0", "seed=0"], trainer)
    for comp, traj in zip(out["completion_ids"], rollout.last, strict=True):
        assert len(traj.steps) >= 1 and len(comp) <= 24
        assert traj.steps[-1].terminated or traj.steps[-1].truncated
        first = traj.steps[0].generation
        assert len(first.prompt_ids) + len(comp) <= 64  # within the model's context
        assert out["turns"][0] < 10  # cut by the budget, not by the env's step limit


def _trainer(tmp_path, **args):
    """What the rollout function reads of a GRPOTrainer: its model, tokenizer and args."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_memory.models import build_tiny_lm

    path = build_tiny_lm(tmp_path / "lm", WORDS)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    model.generation_config.repetition_penalty = 1.05  # as Qwen2.5-Instruct's asks
    fields = {
        "temperature": 0.9,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": None,
        "repetition_penalty": 1.0,
        "generation_kwargs": None,
        **args,
    }
    return SimpleNamespace(
        model=model,
        processing_class=AutoTokenizer.from_pretrained(path, local_files_only=True),
        args=SimpleNamespace(**fields),
    )


def test_the_rollout_samples_with_the_grpo_configs_fields_and_records_them(tmp_path):
    """Issue 45: the rollout sampled with the model's generation config (its repetition
    penalty) and ignored the GRPOConfig's top_p, top_k, min_p and repetition_penalty."""
    from agent_memory.compat.trl import make_rollout_func

    trainer = _trainer(tmp_path, top_p=0.9, top_k=3, min_p=0.05, repetition_penalty=1.2)
    policy = make_rollout_func(_job(), max_new_tokens=2).policy(trainer, 4)
    (g,) = policy.generate(["next red"])
    s = g.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty) == (
        0.9,
        0.9,
        3,
        0.05,
        1.2,
    )
    plain = make_rollout_func(_job(), max_new_tokens=2).policy(_trainer(tmp_path), 4)
    assert plain.sampling_params().repetition_penalty == 1.0  # not the model's 1.05


def test_generation_kwargs_the_rollout_cannot_honour_are_refused(tmp_path):
    from agent_memory.compat.trl import make_rollout_func

    trainer = _trainer(tmp_path, generation_kwargs={"no_repeat_ngram_size": 2})
    with pytest.raises(
        ValueError,
        match=re.escape(
            "GRPOConfig.generation_kwargs={'no_repeat_ngram_size': 2}: this rollout_func samples "
            "with temperature, top_p, top_k, min_p and repetition_penalty from the GRPOConfig and "
            "nothing else"
        ),
    ):
        make_rollout_func(_job(), max_new_tokens=2).policy(trainer, 4)
