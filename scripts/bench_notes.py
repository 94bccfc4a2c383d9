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
notes.md (the table, also printed) and notes.png (success against the horizon).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_lib.trained import REPO, run_benchmark

#: (cues, distractors) of the horizons played: 1x is the training horizon (8 steps).
HORIZONS = ((2, 5), (4, 11), (8, 23))


@dataclass(frozen=True)
class Setting:
    """One configuration: its name, its label in the table, its config and Hydra overrides."""

    name: str
    label: str
    config: str
    overrides: tuple[str, ...] = ()


#: Every configuration's budget: its training time, and its evaluation during training.
BUDGET = ("trainer.max_minutes=10", "trainer.eval_every=10", "trainer.eval_episodes=100")
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
    Setting("notes", "notes the policy writes (trained)", "train_notes", TASK),
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


def compose(config: str, overrides: list[str]) -> Any:
    """The training config ``configs/<config>.yaml`` with the budget and ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from agent_memory.train import load_train, register_train_configs

    register_train_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_train(hydra_compose(config_name=config, overrides=[*BUDGET, *overrides]))


def pretrain_base(out: Path, extra: list[str]) -> list[str]:
    """Build and pretrain the tiny LM every configuration starts from (``<out>/base``), so rows
    differ only in their memory and what RL made of it. It is train_notes' model: its words
    hold every configuration's (the memory blocks' too). Returns the override that loads it;
    none when ``extra`` names a model."""
    from agent_memory.train.model import build_tiny_for_env

    job = compose("train_notes", [*TASK, "trainer.progress=false", *extra])
    if job.trainer.model != "tiny":
        return []
    t0 = time.perf_counter()
    path = build_tiny_for_env(job, job.trainer.tiny, out / "base", seed=job.rollout.seed)
    print(f"pretrained the base model in {time.perf_counter() - t0:.0f} s: {path}", flush=True)
    return [f"trainer.model={path}"]


def play(job: Any, model: Path, cues: int, distractors: int, out: Path) -> dict[str, float]:
    """Greedy play of ``model`` on ``job``'s held-out seeds with ``cues`` over the horizon: its
    success and prompt tokens per step (mean, max)."""
    from agent_memory.config import JobConfig
    from agent_memory.rollout import run_rollout

    t, r = job.trainer, job.rollout
    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(JobConfig)}
    env = dataclasses.replace(
        job.env, kwargs={**job.env.kwargs, "num_cues": cues, "num_distractors": distractors}
    )
    policy = dataclasses.replace(
        job.policy, params={**job.policy.params, "path": str(model), "temperature": 0.0}
    )
    rollout = dataclasses.replace(
        r,
        num_groups=t.eval_episodes,
        group_size=1,
        seed=t.eval_seed,
        save_parquet=False,
        progress=False,
        output_dir=None,
    )
    summary = run_rollout(
        JobConfig(**{**fields, "env": env, "policy": policy, "rollout": rollout}), out
    )
    return {
        "success": float(summary["success_rate"]),
        "tokens_mean": float(summary["mean_prompt_tokens"]),
        "tokens_max": float(summary["max_prompt_tokens"]),
    }


def run_one(setting: Setting, out: Path, extra: list[str]) -> dict[str, Any]:
    """Train one configuration, then play it at every horizon; its figures for the table."""
    from agent_memory.train import train
    from agent_memory.train.checkpoint import find_checkpoint

    job = compose(setting.config, [*setting.overrides, "trainer.progress=false", *extra])
    t0 = time.perf_counter()
    summary = train(job, out / setting.name)
    wall = time.perf_counter() - t0
    model = find_checkpoint(out / setting.name) / "model"
    plays = [play(job, model, c, d, out / setting.name / f"play_{c}_cues") for c, d in HORIZONS]
    return {
        "setting": setting,
        "success": [p["success"] for p in plays],
        "tokens_mean": [p["tokens_mean"] for p in plays],
        "tokens_max": [p["tokens_max"] for p in plays],
        "wall": wall,
        "status": summary["status"],
        "iterations": summary["iterations"],
        "env_steps": summary["env_steps"],
    }


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of ``results``: success, then prompt tokens per step (mean / max), at
    each horizon; the training's env-steps, iterations and time."""
    names = [
        f"{k}x ({c} cues, {c + d + 1} steps)" for k, (c, d) in zip((1, 2, 4), HORIZONS, strict=True)
    ]
    head = [*(f"success {n}" for n in names), *(f"tokens/step {k}x" for k in (1, 2, 4))]
    lines = [
        f"| configuration | {' | '.join(head)} | env-steps | iterations | training time |",
        "|---" * (len(head) + 4) + "|",
    ]
    for r in results:
        cells = [f"{s:.1%}" for s in r["success"]]
        cells += [
            f"{m:.0f} / {x:.0f}" for m, x in zip(r["tokens_mean"], r["tokens_max"], strict=True)
        ]
        lines.append(
            f"| {r['setting'].label} | {' | '.join(cells)} | {r['env_steps']:,} "
            f"| {r['iterations']} | {r['wall'] / 60:.1f} min |"
        )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Success against the horizon, one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = [1, 2, 4]
    for r in results:
        ax.plot(xs, [100 * s for s in r["success"]], marker="o", label=r["setting"].label)
    ax.axhline(25, color="grey", linestyle=":", linewidth=1, label="chance (4 options)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, ["1x (trained)", "2x", "4x"])
    ax.set_xlabel("episode horizon (cues and steps)")
    ax.set_ylabel("greedy success on held-out seeds (%)")
    ax.set_ylim(0, 102)
    ax.set_title("Recall: memory beyond the training horizon")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    run_benchmark(
        "bench_notes.py",
        __doc__ or "",
        SETTINGS,
        QUICK,
        run_one,
        lambda r: "success at 1x/2x/4x: " + ", ".join(f"{s:.1%}" for s in r["success"]),
        table,
        plot,
        "notes",
        check=lambda s, extra: compose(s.config, [*s.overrides, "trainer.progress=false", *extra]),
        prepare=pretrain_base,
    )


if __name__ == "__main__":
    main()
