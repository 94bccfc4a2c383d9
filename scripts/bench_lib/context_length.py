"""The context-length benchmark's data and report: per-step prompt figures, tables, plots.

Each benchmark job (one env x one memory strategy x one history length) writes ``steps.csv``:
one row per step with the prompt's tokens (exact with the configured tokenizer) and characters.
:func:`write_report` reads every ``steps.csv`` under a directory (one run, or a whole ``-m``
sweep) and writes, per env, a markdown table and PNG plots; :class:`ReportCallback` does it when
a Hydra run or sweep ends.

Table columns: episodes, mean / p95 / max prompt tokens per step, mean prompt tokens per episode
(what a rollout pays per trajectory), growth (least-squares slope of prompt tokens against the
step number, tokens per step) over all steps and after the window's warm-up (steps past
``history_length + 1``), and success rate. Jobs of a sweep that amount to the same strategy
(``memory=full`` with any ``env.history_length``) count once (and the benchmark script runs them
once: :mod:`bench_lib.sweep`).

Plots: ``<env>.png``, prompt tokens per step, one line per strategy; ``<env>_success.png`` where a
strategy was swept over the window: success rate and mean tokens per step against k, in two panels
(no second y axis). Every series of a figure has its own colour, line style and marker, and a
strategy keeps its style in every figure (:mod:`bench_lib.styles`).
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench_lib.styles import assign_styles

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "CSV_FIELDS",
    "ReportCallback",
    "by_strategy",
    "job_rows",
    "read_rows",
    "report_figures",
    "strategy_label",
    "success_figure",
    "tokens_figure",
    "write_report",
]

CSV_FIELDS = [
    "job",
    "env",
    "env_config",
    "memory",
    "strategy",
    "history_length",
    "max_history_tokens",
    "max_prompt_tokens",
    "token_counter",
    "traj_uid",
    "seed",
    "step",
    "prompt_tokens",
    "prompt_chars",
    "history_steps",
    "won",
    "episode_return",
]
#: Plots with more strategies than this show mean lines only (bands would hide each other).
MAX_BANDS = 4


def strategy_label(
    memory: str, history_length: int, max_history_tokens: Any, max_prompt_tokens: Any
) -> str:
    """A readable name for one configuration, e.g. ``window k=3`` or ``token_budget 1024``.

    Example:
        >>> strategy_label("window", 3, None, None), strategy_label("full", -1, None, None)
        ('window k=3', 'full')
    """
    if memory in ("none", "full"):
        return memory
    if memory == "token_budget":
        return f"token_budget {max_prompt_tokens or max_history_tokens}"
    return f"{memory} k={history_length}" if history_length >= 0 else f"{memory} all"


def job_rows(trajs: Iterable[Any], labels: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-step CSV rows of one job's trajectories; ``labels`` holds the job-wide columns."""
    rows = []
    for t in trajs:
        for s in t.steps:
            rows.append(
                {
                    **labels,
                    "traj_uid": t.spec.traj_uid,
                    "seed": t.spec.seed,
                    "step": s.step,
                    "prompt_tokens": s.context_tokens,
                    "prompt_chars": s.context_chars,
                    "history_steps": s.history_steps,
                    "won": int(t.won),
                    "episode_return": t.episode_return,
                }
            )
    return rows


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def read_rows(root: Path) -> list[dict[str, Any]]:
    """Every ``steps.csv`` row under ``root`` (``job`` = its directory), numbers parsed."""
    rows = []
    for path in sorted(root.rglob("steps.csv")):
        with path.open(encoding="utf-8") as f:
            for r in csv.DictReader(f):
                r["job"] = str(path.parent.relative_to(root))
                for key in (
                    "history_length",
                    "step",
                    "prompt_tokens",
                    "prompt_chars",
                    "history_steps",
                    "won",
                    "seed",
                ):
                    r[key] = int(r[key])
                r["episode_return"] = float(r["episode_return"])
                rows.append(r)
    return rows


def _slope(rows: list[dict[str, Any]]) -> float:
    steps = np.array([r["step"] for r in rows], dtype=np.float64)
    if len(set(steps.tolist())) < 2:
        return 0.0
    tokens = np.array([r["prompt_tokens"] for r in rows], dtype=np.float64)
    return float(np.polyfit(steps, tokens, 1)[0])


def _stats(rows: list[dict[str, Any]]) -> dict[str, float]:
    tokens = np.array([r["prompt_tokens"] for r in rows], dtype=np.float64)
    episodes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        episodes[r["traj_uid"]].append(r)
    k = rows[0]["history_length"]
    warm = k + 1 if k >= 0 else 0  # a window is full from step k + 1 on
    return {
        "episodes": len(episodes),
        "mean": float(tokens.mean()),
        "p95": float(np.percentile(tokens, 95)),
        "max": float(tokens.max()),
        "per_episode": float(
            np.mean([sum(r["prompt_tokens"] for r in ep) for ep in episodes.values()])
        ),
        "growth": _slope(rows),
        "late_growth": _slope([r for r in rows if r["step"] > warm]),
        "success": float(np.mean([ep[0]["won"] for ep in episodes.values()])),
    }


def _order(label: str) -> tuple[int, str, int]:
    kind = label.split()[0]
    rank = {"none": 0, "window": 1, "token_budget": 2, "full": 3}.get(kind, 4)
    num = [int(x) for x in label.replace("k=", " ").split() if x.isdigit()]
    return rank, kind, num[0] if num else 0


def env_label(config: str, env_id: str) -> str:
    """The report's name for an env: its config's (``env=recall``), or the id itself for
    ``env=gym``, which runs whatever ``env.id`` names (an own env).

    Example:
        >>> env_label("recall", "agent_memory/Recall-v0"), env_label("gym", "my_envs:Corridor-v0")
        ('recall', 'my_envs:Corridor-v0')
    """
    return env_id if config == "gym" else config


def file_stem(label: str) -> str:
    """``label`` as a file name (a plot's): an id's ``:`` and ``/`` become ``_``.

    Example:
        >>> file_stem("my_envs:Corridor-v0")
        'my_envs_Corridor-v0'
    """
    return re.sub(r"[^\w.-]", "_", label)


def by_strategy(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Rows grouped per env config, then per strategy label (in table order). Jobs that amount
    to the same strategy (same label: same seeds, same config) count once: the first job's rows."""
    by_env: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    first_job: dict[tuple[str, str], str] = {}
    for r in rows:
        key = (r["env_config"], r["strategy"])
        if first_job.setdefault(key, r["job"]) == r["job"]:
            by_env[r["env_config"]][r["strategy"]].append(r)
    return {
        env: {label: strategies[label] for label in sorted(strategies, key=_order)}
        for env, strategies in sorted(by_env.items())
    }


def report_figures(rows: Sequence[dict[str, Any]]) -> dict[str, Figure]:
    """The report's plots by file name: ``<env>.png`` (tokens per step, every strategy) and,
    where a strategy was swept over at least two window sizes, ``<env>_success.png``."""
    if not rows:
        return {}
    counter = rows[0]["token_counter"]
    figures: dict[str, Figure] = {}
    for env, strategies in by_strategy(rows).items():
        figures[f"{file_stem(env)}.png"] = tokens_figure(env, strategies, counter)
        families: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(dict)
        for label, strategy_rows in strategies.items():
            if " k=" in label:  # swept over the window: "window k=3", "retrieval k=1"
                families[label.split()[0]][strategy_rows[0]["history_length"]] = strategy_rows
        swept = {kind: by_k for kind, by_k in families.items() if len(by_k) >= 2}
        if swept:
            figures[f"{file_stem(env)}_success.png"] = success_figure(env, swept, counter)
    return figures


def write_report(root: str | Path, title: str = "Context length per step") -> Path | None:
    """Tables (``report.md``), merged CSV (``context_steps.csv``) and plots (``plots/``) for
    every ``steps.csv`` under ``root``. Returns the report's path (None when there is no data)."""
    root = Path(root)
    rows = read_rows(root)
    if not rows:
        return None
    write_csv(root / "context_steps.csv", rows)
    counter = rows[0]["token_counter"]
    lines = [f"# {title}", "", f"Prompt tokens counted with `{counter}`.", ""]
    plots = root / "plots"
    plots.mkdir(exist_ok=True)
    figures = report_figures(rows)
    for name, fig in figures.items():
        fig.savefig(plots / name)
    for env, strategies in by_strategy(rows).items():
        lines += [
            f"## {env}",
            "",
            "| strategy | episodes | mean tokens/step | p95 | max | tokens/episode "
            "| growth (tokens/step) | after warm-up | success |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for label, strategy_rows in strategies.items():
            s = _stats(strategy_rows)
            lines.append(
                f"| {label} | {s['episodes']} | {s['mean']:.0f} | {s['p95']:.0f} | {s['max']:.0f} "
                f"| {s['per_episode']:.0f} | {s['growth']:+.1f} | {s['late_growth']:+.1f} "
                f"| {s['success']:.0%} |"
            )
        stem = file_stem(env)
        lines += ["", f"![{env}](plots/{stem}.png)", ""]
        if f"{stem}_success.png" in figures:
            lines += [f"![{env} success](plots/{stem}_success.png)", ""]
    report = root / "report.md"
    report.write_text("\n".join(lines))
    return report


def tokens_figure(env: str, strategies: dict[str, list[dict[str, Any]]], counter: str) -> Figure:
    """Prompt tokens against the step of the episode: one line (the mean over episodes) per
    strategy, each in its own style (:mod:`bench_lib.styles`); with at most
    :data:`MAX_BANDS` strategies, a band shows min..max over episodes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8.5, 4.6), dpi=110, layout="constrained")
    ax = fig.subplots()
    styles = assign_styles(strategies)
    bands = len(strategies) <= MAX_BANDS
    for i, (label, rows) in enumerate(strategies.items()):
        per_step: dict[int, list[int]] = defaultdict(list)
        for r in rows:
            per_step[r["step"]].append(r["prompt_tokens"])
        steps = sorted(per_step)
        mean = [float(np.mean(per_step[s])) for s in steps]
        every = max(1, len(steps) // 6)
        # Series that coincide (a window as long as the episodes and the full history) stay
        # visible: their hollow markers fall on different steps.
        ax.plot(
            steps,
            mean,
            label=label,
            linewidth=1.5,
            markersize=6,
            markerfacecolor="none",
            markevery=(i % every, every),
            **styles[label].kwargs(),
        )
        if bands:
            lo = [min(per_step[s]) for s in steps]
            hi = [max(per_step[s]) for s in steps]
            ax.fill_between(steps, lo, hi, color=styles[label].color, alpha=0.12, linewidth=0)
    ax.set_xlabel("step of the episode")
    ax.set_ylabel(f"prompt tokens ({counter})")
    spread = ", band = min..max over episodes" if bands else ""
    ax.set_title(f"{env}: prompt tokens per step (mean{spread})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def success_figure(
    env: str, families: dict[str, dict[int, list[dict[str, Any]]]], counter: str
) -> Figure:
    """What the window buys and costs, in two panels over ``history_length``: success rate on
    top, mean prompt tokens per step below; one series per strategy swept over k."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 6.0), dpi=110, layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    styles = assign_styles(families)
    ks: set[int] = set()
    for i, (kind, by_k) in enumerate(families.items()):
        k = sorted(by_k)
        ks.update(k)
        stats = [_stats(by_k[x]) for x in k]
        # Hollow markers, each series a size smaller: points that coincide stay visible.
        style = {
            **styles[kind].kwargs(),
            "markerfacecolor": "none",
            "linewidth": 1.5,
            "markersize": max(4.0, 11.0 - 2.0 * i),
        }
        top.plot(k, [s["success"] for s in stats], label=kind, **style)
        bottom.plot(k, [s["mean"] for s in stats], label=kind, **style)
    top.set_ylabel("success rate")
    top.set_ylim(-0.05, 1.05)
    top.set_title(f"{env}: what the history buys (success) and costs (tokens)")
    top.legend(fontsize=8)
    bottom.set_ylabel(f"mean prompt tokens per step ({counter})")
    bottom.set_xlabel("history_length (k)")
    bottom.set_xticks(sorted(ks))
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover - hydra is a core dependency
    Callback = object  # type: ignore[assignment,misc]


class ReportCallback(Callback):  # type: ignore[misc]
    """Hydra callback: write the report when a run (its directory) or a sweep (the sweep
    directory, every job in it) ends. Configured in ``configs/bench_context.yaml``."""

    def on_run_end(self, config: Any, **kwargs: Any) -> None:
        report = write_report(config.hydra.runtime.output_dir)
        if report is not None:
            print(f"report: {report}")

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        report = write_report(config.hydra.sweep.dir)
        if report is not None:
            print(f"report: {report}")
