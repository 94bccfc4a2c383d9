"""What the memory keeps decides what RL can learn: the demonstration behind the README's table.

    python scripts/bench_learning.py                  # every configuration (~10 min each here)
    python scripts/bench_learning.py --only window_reaches retrieval
    python scripts/bench_learning.py --quick          # 2 iterations each: a smoke test

Each configuration trains the tiny LM of configs/train_recall.yaml from scratch (GRPO, the score
policy, the real rollout path: Ray workers, the memory wrappers) on Recall, where the cue comes
env.kwargs.num_distractors = 3 steps before a 4-option question, and evaluates it greedily on
held-out seeds every 10 iterations. Configurations differ only in their memory overrides (and
PPO in algo=ppo): they run one after another in this process, with the same seeds.

Writes to --out (default outputs/bench_learning/<date-time>): one run directory per
configuration (metrics.csv, checkpoints, ...), learning.md (the table, also printed) and
learning.png (eval success against env-steps, one curve per configuration).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_lib.trained import REPO, run_benchmark


@dataclass(frozen=True)
class Setting:
    """One demo configuration: its name, what it shows, and its Hydra overrides."""

    name: str
    label: str
    overrides: tuple[str, ...]


#: The demonstration's configurations (num_distractors = 3: the cue is history step 1 of 4).
SETTINGS = (
    Setting("window_reaches", "window 4 (reaches the cue)", ("env.history_length=4",)),
    Setting("window_misses", "window 3 (misses the cue)", ("env.history_length=3",)),
    Setting(
        "retrieval",
        "retrieval, window 1",
        ("memory=retrieval", "env.history_length=1", "memory.params.top_k=1"),
    ),
    Setting(
        "compaction",
        "compaction, window 1",
        (
            "memory=compaction",
            "env.history_length=1",
            "memory.params.trigger_steps=2",
            "memory.params.keep_last=1",
        ),
    ),
    Setting("ppo_window_reaches", "PPO, window 4", ("env.history_length=4", "algo=ppo")),
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
)


def compose(overrides: list[str]) -> Any:
    """The training config of configs/train_recall.yaml with ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from agent_memory.train import load_train, register_train_configs

    register_train_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_train(hydra_compose(config_name="train_recall", overrides=overrides))


def run_one(
    setting: Setting, out: Path, extra: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Train one configuration; its figures for the table."""
    from agent_memory.train import read_metrics, train

    job = compose([*setting.overrides, "trainer.progress=false", *extra])
    t0 = time.perf_counter()
    summary = train(job, out / setting.name)
    wall = time.perf_counter() - t0
    rows = read_metrics(out / setting.name / "metrics.csv")
    evals = [r for r in rows if "eval/success" in r]
    train_rows = [r for r in rows if "tokens/prompt_per_episode" in r]
    return {
        "setting": setting,
        "final": evals[-1]["eval/success"] if evals else float("nan"),
        "best": max((r["eval/success"] for r in evals), default=float("nan")),
        "tokens": evals[-1].get("eval/prompt_tokens_per_episode", float("nan")),
        "train_tokens": (
            sum(r["tokens/prompt_per_episode"] for r in train_rows) / len(train_rows)
            if train_rows
            else float("nan")
        ),
        "env_steps": summary["env_steps"],
        "iterations": summary["iterations"],
        "wall": wall,
        "curve": [(r["env_steps"], r["eval/success"]) for r in evals],
        "status": summary["status"],
    }


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The markdown table of ``results``."""
    lines = [
        "| configuration | final eval success | best eval success | prompt tokens / episode "
        "| iterations | env-steps | wall time |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting'].label} | {r['final']:.1%} | {r['best']:.1%} | {r['tokens']:.0f} "
            f"| {r['iterations']} | {r['env_steps']:,} | {r['wall'] / 60:.1f} min |"
        )
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path, args: argparse.Namespace) -> None:
    """Eval success against env-steps, one curve per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        xs, ys = zip(*r["curve"], strict=True) if r["curve"] else ((), ())
        ax.plot(xs, [100 * y for y in ys], marker="o", markersize=3, label=r["setting"].label)
    ax.axhline(25, color="grey", linestyle=":", linewidth=1, label="chance (4 options)")
    ax.set_xlabel("training env-steps")
    ax.set_ylabel("eval success on held-out seeds (%)")
    ax.set_ylim(0, 102)
    ax.set_title("Recall (cue 3 steps before the question): what the memory keeps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    run_benchmark(
        "bench_learning.py",
        __doc__ or "",
        SETTINGS,
        QUICK,
        run_one,
        lambda r: (
            f"final eval success {r['final']:.1%} (best {r['best']:.1%}), "
            f"{r['tokens']:.0f} prompt tokens/episode, {r['wall'] / 60:.1f} min"
        ),
        table,
        plot,
        "learning",
        check=lambda s, extra: compose([*s.overrides, "trainer.progress=false", *extra]),
    )


if __name__ == "__main__":
    main()
