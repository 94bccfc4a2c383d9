"""Train with TRL's ``GRPOTrainer`` on whole episodes played in this project's envs, on CPU.

What a user writes to train a model with TRL on agent_memory rollouts: a job config (env,
memory, prompt template, parser), :func:`agent_memory.compat.trl.make_rollout_func` as the
trainer's ``rollout_func``, and :func:`~agent_memory.compat.trl.env_reward` as its reward. Each
dataset prompt names a reset seed (``"seed=3"``); TRL repeats it ``--num-generations`` times, and
the copies play the same start, so they form a GRPO group. Each episode is one sample (the
``episode`` layout): the first prompt, then every later token, with ``env_mask`` 0 on the env's.

Without ``--model`` it builds a tiny random-weight model offline, whose vocabulary is Recall's
action words, answering with one word per turn, so that valid and invalid answers (penalised)
make returns differ within a group from the first step. With ``--model DIR`` (a local
``save_pretrained`` directory with a chat template) it plays the default, tagged prompts.

Run (about half a minute on a laptop CPU)::

    python examples/trl_grpo.py --steps 8
    python examples/trl_grpo.py --model ./my-model --max-new-tokens 64 --steps 50

It prints one line per optimizer step (mean reward, its std) and a final JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from agent_memory.config import (
    EnvConfig,
    JobConfig,
    MemoryConfig,
    ParserConfig,
    PolicyConfig,
    TemplateConfig,
)


def make_job(tiny: bool, max_steps: int) -> JobConfig:
    """Recall in whole-episode chats: the history is the model's own conversation."""
    env = EnvConfig(
        id="agent_memory/Recall-v0",
        kwargs={"num_distractors": 1, "num_choices": 2},
        history_length=-1,
        formatter="transcript",
        max_steps=max_steps,
    )
    if tiny:  # one untagged word per answer; an invalid one costs 0.5
        env.template = TemplateConfig(no_history="{observation}")
        env.parser = ParserConfig(tag=None, think_tag=None, invalid_penalty=-0.5)
    return JobConfig(env=env, memory=MemoryConfig(), policy=PolicyConfig("hf"))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a local model directory (default: build a tiny one)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps")
    parser.add_argument("--groups", type=int, default=2, help="seeds (GRPO groups) per step")
    parser.add_argument("--num-generations", type=int, default=4, help="episodes per group")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="tokens per turn")
    parser.add_argument("--max-completion-length", type=int, default=96)
    parser.add_argument("--max-steps-per-episode", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="the trainer's output directory")
    args = parser.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from agent_memory.compat.trl import env_reward, make_rollout_func
    from agent_memory.models import build_tiny_lm

    out = Path(args.output_dir or tempfile.mkdtemp(prefix="trl_grpo-"))
    tiny = args.model is None
    path = args.model or build_tiny_lm(
        out / "tiny-lm",
        ["next", "red", "blue", "green", "brown"],
        init_range=0.02,
        seed=args.seed,
    )
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    job = make_job(tiny, args.max_steps_per_episode)
    max_new = args.max_new_tokens or (1 if tiny else 64)
    rollout_func = make_rollout_func(job, max_new_tokens=max_new)

    batch = args.groups * args.num_generations
    config = GRPOConfig(
        output_dir=str(out / "trainer"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        per_device_train_batch_size=batch,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_steps=args.steps,
        learning_rate=args.lr,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=args.seed,
    )
    seeds = Dataset.from_dict({"prompt": [f"seed={i}" for i in range(args.groups * args.steps)]})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=config,
        train_dataset=seeds,
        processing_class=tokenizer,
        rollout_func=rollout_func,
    )
    trainer.train()

    logged = [h for h in trainer.state.log_history if "reward" in h]
    for h in logged:
        print(f"step {h['step']:>3}  reward {h['reward']:+.3f}  std {h['reward_std']:.3f}")
    summary = {
        "steps": trainer.state.global_step,
        "rewards": [round(h["reward"], 4) for h in logged],
        "last_batch_returns": [t.episode_return for t in rollout_func.last],
        "output_dir": str(out),
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
