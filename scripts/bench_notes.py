"""Memory the agent learns to write, beyond the training horizon: the table behind docs/training.md.

    python scripts/bench_notes.py                        # all: ~65 min on 2 cores (~11 each)
    python scripts/bench_notes.py --jobs 6               # 6 at once (one process each: 16 cores)
    python scripts/bench_notes.py --only notes notes_memory_untrained
    python scripts/bench_notes.py --quick                # 2 iterations each: a smoke test

The tiny LM of configs/train_notes.yaml is built and pretrained once (its generic pretraining,
written to <out>/base); each configuration starts from it, trains it (GRPO, the score policy,
the real rollout path; at most trainer.max_minutes) on Recall with 2 cues over 8 steps, then
plays its final weights greedily on held-out seeds at 1x, 2x and 4x that horizon (4 cues over
16 steps, 8 over 32). Configurations differ in their memory: a window holding about
the note's tokens, the whole history, extractive compaction, retrieval of 2 past steps, the note
the policy writes (memory=notes), and that note with its memory choices left out of the loss
(trainer.train_memory_tokens=false).

Writes to --out (default outputs/bench_notes/<date-time>): one run directory per configuration,
notes.md (the table, also printed), notes.json and notes.png (success against the horizon).
The machinery is bench_horizon's (scripts/bench_lib/horizons.py); this is its Recall variant.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench_lib import horizons
from bench_lib.horizons import Bench, Setting
from bench_lib.trained import run_benchmark

#: The horizons played, as multiples of the training one (2 cues over 8 steps).
MULTIPLES = (1, 2, 4)
#: The task and model of configs/train_notes.yaml, for the configurations built on train_recall.
TASK = (
    "env.kwargs.num_cues=2",
    "env.kwargs.num_distractors=5",
    "env.parser.tag=action",
    "env.kwargs.answer_format=statement",
    "trainer.minibatch_size=64",
    "trainer.tiny.lowercase=true",
    "trainer.tiny.pretrain_steps=3000",
)


def scale(kwargs: dict[str, Any], k: int) -> dict[str, Any]:
    """Recall's keyword arguments at ``k`` times the horizon: ``k`` times the cues and the steps.

    Example:
        >>> scale({"num_cues": 2, "num_distractors": 5}, 4)
        {'num_cues': 8, 'num_distractors': 23}
    """
    cues, steps = kwargs["num_cues"], kwargs["num_cues"] + kwargs["num_distractors"] + 1
    return {**kwargs, "num_cues": k * cues, "num_distractors": k * (steps - cues) - 1}


BENCH = Bench(
    title="Recall: memory beyond the training horizon",
    # train_notes' model: its words hold every configuration's (the memory blocks' too).
    base_config="train_notes",
    base_overrides=TASK,
    # Every configuration's budget: its training time, and its evaluation during training.
    budget=("trainer.max_minutes=10", "trainer.eval_every=10", "trainer.eval_episodes=100"),
    scale=scale,
    chance=0.25,
)
SETTINGS = (
    Setting(
        "window",
        "window 3 (about the note's tokens)",
        "train_recall",
        (*TASK, "env.history_length=3"),
    ),
    Setting("full", "whole history", "train_recall", (*TASK, "env.history_length=-1")),
    Setting(
        "compaction",
        "extractive compaction, window 1",
        "train_recall",
        (
            *TASK,
            "memory=compaction",
            "env.history_length=1",
            "memory.params.trigger_steps=2",
            "memory.params.keep_last=1",
        ),
    ),
    Setting(
        "retrieval",
        "retrieval, 2 steps",
        "train_recall",
        (*TASK, "memory=retrieval", "env.history_length=2"),
    ),
    Setting("notes", "notes, score policy chooses the line (trained)", "train_notes", TASK),
    Setting(
        "notes_memory_untrained",
        "notes, memory choices not trained",
        "train_notes",
        (*TASK, "trainer.train_memory_tokens=false"),
    ),
)

QUICK = (
    "trainer.iterations=2",
    "trainer.eval_every=1",
    "trainer.eval_episodes=8",
    "rollout.num_groups=2",
    "rollout.group_size=2",
    "rollout.envs_per_worker=8",
    "trainer.tiny.vocab_episodes=8",
    "trainer.logger=[csv]",
    "trainer.tiny.pretrain_steps=2",
)


def run_one(
    setting: Setting, out: Path, extra: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Train one configuration, then play it at 1x, 2x and 4x the horizon."""
    args = argparse.Namespace(**{**vars(args), "horizons": MULTIPLES, "episodes": None})
    return horizons.run_one(BENCH, setting, out, extra, args)


def main() -> None:
    run_benchmark(
        "bench_notes.py",
        __doc__ or "",
        SETTINGS,
        QUICK,
        run_one,
        horizons.report,
        lambda results, args: horizons.table(results, MULTIPLES),
        lambda results, path, args: horizons.plot(results, path, MULTIPLES, BENCH),
        "notes",
        check=lambda s, extra: horizons.check_setting(BENCH, s, extra),
        prepare=lambda out, extra: horizons.pretrain_base(BENCH, out, extra),
    )


if __name__ == "__main__":
    main()
