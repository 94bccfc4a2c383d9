"""Train at the training horizon, then play the final weights greedily at multiples of it: the
machinery bench_notes (Recall at 1x / 2x / 4x) and bench_horizon (Track at 1x / 10x / 100x) share.

Each configuration starts from one pretrained tiny LM (``<out>/base``, :func:`pretrain_base`), is
trained (or not: the untrained row plays the base itself), then plays each horizon on the same
held-out seeds (:func:`play`). :func:`table` and :func:`plot` show success, prompt tokens per step,
steps per episode (the horizon really played), the note's tokens, and what training reached.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_lib.trained import REPO

#: The most prompts per generate() / forward call when playing: the held-out episodes step
#: together, each step one call for all of them (a tiny LM's batch of 100 short prompts is cheap).
PLAY_BATCH = 256


@dataclass(frozen=True)
class Setting:
    """One configuration: its name, its label in the table, its config and Hydra overrides;
    ``trained=False`` plays the pretrained base model without RL."""

    name: str
    label: str
    config: str
    overrides: tuple[str, ...] = ()
    trained: bool = True


@dataclass(frozen=True)
class Bench:
    """What one horizon benchmark trains and plays.

    Attributes:
        title: the plot's title.
        base_config: the training config whose tiny LM every configuration starts from.
        base_overrides: its overrides (the task and the model).
        budget: overrides for every configuration (training budget, evaluation).
        scale: the env's keyword arguments at ``k`` times the training horizon.
        chance: the success of a uniform guess (the plot's dotted line).
    """

    title: str
    base_config: str
    base_overrides: tuple[str, ...]
    budget: tuple[str, ...]
    scale: Callable[[dict[str, Any], int], dict[str, Any]]
    chance: float


def own_params(config: str, group: str) -> tuple[str, ...]:
    """The ``<group>.params`` keys that ``configs/<config>.yaml`` and the configs it builds on
    (its defaults list's other top-level configs) set themselves: a row that swaps that group
    (``memory=window``, ``policy=score``) deletes them (``~memory.params.<key>``), since another
    strategy or policy may have none of those settings.

    Example:
        >>> own_params("train_notes", "memory")
        ('update', 'note_tokens')
    """
    import yaml

    data = yaml.safe_load((REPO / "configs" / f"{config}.yaml").read_text()) or {}
    keys: list[str] = []
    for entry in data.get("defaults") or ():
        if isinstance(entry, str) and (REPO / "configs" / f"{entry}.yaml").is_file():
            keys += own_params(entry, group)
    keys += ((data.get(group) or {}).get("params") or {}).keys()
    return tuple(dict.fromkeys(keys))


def compose(bench: Bench, config: str, overrides: Sequence[str]) -> Any:
    """The training config ``configs/<config>.yaml`` with the bench's budget and ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from agent_memory.train import load_train, register_train_configs

    register_train_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_train(hydra_compose(config_name=config, overrides=[*bench.budget, *overrides]))


def compose_setting(bench: Bench, setting: Setting, extra: Sequence[str]) -> Any:
    """``setting``'s training config, with ``extra`` (the command line's overrides) last."""
    return compose(bench, setting.config, [*setting.overrides, "trainer.progress=false", *extra])


def check_setting(bench: Bench, setting: Setting, extra: Sequence[str]) -> Any:
    """``setting``'s training config, refused (``ConfigError``) where its env, memory or prompt
    cannot be built: what training and playing would find only when that row's turn came."""
    from agent_memory.policies import make_policy
    from agent_memory.rollout.driver.preflight import preflight

    job = compose_setting(bench, setting, extra)
    preflight(job, policy=make_policy("random"))
    return job


def pretrain_base(bench: Bench, out: Path, extra: list[str]) -> list[str]:
    """Build and pretrain the tiny LM every configuration starts from (``<out>/base``), so rows
    differ only in their memory and what RL made of it. Returns the override that loads it;
    none when ``extra`` names a model."""
    from agent_memory.train.model import build_tiny_for_env

    job = compose(
        bench, bench.base_config, [*bench.base_overrides, "trainer.progress=false", *extra]
    )
    if job.trainer.model != "tiny":
        return []
    t0 = time.perf_counter()
    path = build_tiny_for_env(job, job.trainer.tiny, out / "base", seed=job.rollout.seed)
    print(f"pretrained the base model in {time.perf_counter() - t0:.0f} s: {path}", flush=True)
    return [f"trainer.model={path}"]


def play(
    job: Any, model: Path, env_kwargs: dict[str, Any], episodes: int, out: Path
) -> dict[str, float]:
    """Greedy play of ``model`` on ``episodes`` held-out seeds (from ``trainer.eval_seed``) of
    ``job``'s env with ``env_kwargs``, every episode stepping together (the policy batches up
    to :data:`PLAY_BATCH` prompts). Its success, prompt tokens per step (mean, max), steps per
    episode, the note's tokens (mean, max over steps; NaN without a note) and seconds."""
    from agent_memory.config import JobConfig
    from agent_memory.rollout import run_rollout

    t, r = job.trainer, job.rollout
    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(JobConfig)}
    env = dataclasses.replace(job.env, kwargs=env_kwargs)
    params = {**job.policy.params, "path": str(model), "temperature": 0.0}
    if "batch_size" in params:
        params["batch_size"] = max(int(params["batch_size"]), min(episodes, PLAY_BATCH))
    policy = dataclasses.replace(job.policy, params=params)
    rollout = dataclasses.replace(
        r,
        num_groups=episodes,
        group_size=1,
        seed=t.eval_seed,
        envs_per_worker=max(r.envs_per_worker, math.ceil(episodes / r.num_workers)),
        save_parquet=False,
        progress=False,
        output_dir=None,
    )
    t0 = time.perf_counter()
    summary = run_rollout(
        JobConfig(**{**fields, "env": env, "policy": policy, "rollout": rollout}), out
    )
    seconds = time.perf_counter() - t0
    notes = _note_tokens(out / "trajectories.jsonl")
    return {
        "success": float(summary["success_rate"]),
        "tokens_mean": float(summary["mean_prompt_tokens"]),
        "tokens_max": float(summary["max_prompt_tokens"]),
        "steps": float(summary["mean_length"]),
        "note_mean": sum(notes) / len(notes) if notes else math.nan,
        "note_max": float(max(notes)) if notes else math.nan,
        "seconds": seconds,
    }


def _note_tokens(rows: Path) -> list[int]:
    """The note's tokens after each step of a rollout's rows (``memory_note_tokens``)."""
    out = []
    with rows.open() as f:
        for line in f:
            n = json.loads(line).get("memory_note_tokens")
            if n is not None:
                out.append(int(n))
    return out


def run_one(
    bench: Bench, setting: Setting, out: Path, extra: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    """Train one configuration (unless ``setting.trained`` is false), then play it at each of
    ``args.horizons`` (multiples of the training horizon) on ``args.episodes`` held-out seeds
    (``trainer.eval_episodes`` when None); its figures for the table."""
    from agent_memory.train import train
    from agent_memory.train.checkpoint import find_checkpoint

    job = compose_setting(bench, setting, extra)
    t0 = time.perf_counter()
    if setting.trained:
        summary = train(job, out / setting.name)
        model = find_checkpoint(out / setting.name) / "model"
    else:
        summary = {"status": "ok", "iterations": 0, "env_steps": 0}
        model = Path(job.trainer.model)
    wall = time.perf_counter() - t0
    episodes = args.episodes or job.trainer.eval_episodes
    plays = [
        play(
            job,
            model,
            bench.scale(dict(job.env.kwargs), k),
            episodes,
            out / setting.name / f"play_{k}x",
        )
        for k in args.horizons
    ]
    result: dict[str, Any] = {
        key: [p[key] for p in plays]
        for key in ("success", "tokens_mean", "tokens_max", "steps", "seconds")
    }
    notes = [p for p in plays if not math.isnan(p["note_mean"])]
    return {
        "setting": setting,
        "horizons": list(args.horizons),
        "episodes": episodes,
        **result,
        "note_mean": max((p["note_mean"] for p in notes), default=None),
        "note_max": max((p["note_max"] for p in notes), default=None),
        "wall": wall,
        "status": summary["status"],
        "stopped": summary.get("stopped"),
        "iterations": summary["iterations"],
        "iterations_planned": job.trainer.iterations if setting.trained else 0,
        "env_steps": summary["env_steps"],
    }


def report(result: dict[str, Any]) -> str:
    """One line of ``result``: its success at each horizon."""
    return f"success at {'/'.join(f'{k}x' for k in result['horizons'])}: " + ", ".join(
        f"{s:.1%}" for s in result["success"]
    )


def table(results: list[dict[str, Any]], horizons: Sequence[int]) -> str:
    """The markdown table of ``results``: success, then prompt tokens per step (mean / max), at
    each horizon; the steps per episode played at each; the note's tokens (mean / max over the
    played steps); the training's env-steps, iterations (of those asked for; "time cap" when
    ``trainer.max_minutes`` stopped it first), training and play time."""
    ks = [f"{k}x" for k in horizons]
    head = [
        *(f"success {k}" for k in ks),
        *(f"tokens/step {k}" for k in ks),
        f"steps/episode {' / '.join(ks)}",
        "note tokens",
        "env-steps",
        "iterations",
        "training time",
        "play time",
    ]
    lines = [f"| configuration | {' | '.join(head)} |", "|---" * (len(head) + 1) + "|"]
    for r in results:
        cells = [f"{s:.1%}" for s in r["success"]]
        cells += [
            f"{m:.0f} / {x:.0f}" for m, x in zip(r["tokens_mean"], r["tokens_max"], strict=True)
        ]
        cells.append(" / ".join(f"{s:g}" for s in (round(v, 1) for v in r["steps"])))
        note = r.get("note_mean")
        cells.append("-" if note is None else f"{note:.0f} / {r['note_max']:.0f}")
        cells.append(f"{r['env_steps']:,}")
        cells.append(_iterations(r))
        cells.append(f"{r['wall'] / 60:.1f} min")
        cells.append(f"{sum(r['seconds']) / 60:.1f} min")
        lines.append(f"| {r['setting'].label} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _iterations(result: dict[str, Any]) -> str:
    """The iterations cell: reached / asked for, and why it stopped short."""
    if not result["iterations_planned"]:
        return "0 (untrained)"
    cell = f"{result['iterations']} / {result['iterations_planned']}"
    return cell + (" (time cap)" if result.get("stopped") == "time_limit" else "")


def plot(results: list[dict[str, Any]], path: Path, horizons: Sequence[int], bench: Bench) -> None:
    """Success against the horizon (a log axis), one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    xs = list(horizons)
    for r in results:
        ax.plot(xs, [100 * s for s in r["success"]], marker="o", label=r["setting"].label)
    ax.axhline(100 * bench.chance, color="grey", linestyle=":", linewidth=1, label="chance")
    if len(set(xs)) > 1:
        ax.set_xscale("log")
    ax.set_xticks(xs, [f"{k}x" + (" (trained)" if k == 1 else "") for k in xs])
    ax.minorticks_off()
    ax.set_xlabel("episode horizon (multiple of the training horizon)")
    ax.set_ylabel("greedy success on held-out seeds (%)")
    ax.set_ylim(0, 102)
    ax.set_title(bench.title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
