"""What each memory allows on the Track task, read by a perfect reader: the ceilings table.

    python scripts/ceilings.py                                    # 100 episodes, horizons 1 10 100
    python scripts/ceilings.py --episodes 20 --horizons 1 10      # quicker
    python scripts/ceilings.py --only window retrieval --out outputs/ceilings/mine

For each horizon and each hand-written memory strategy (at its defaults, its history budget set
to the note's, ``memory.notes.params.note_tokens`` unless ``--note-tokens``), it runs real
rollouts of ``env=track`` (scripts/rollout.py's path: Ray workers, the memory wrappers) with a
policy that knows nothing (``policy=random``: before the question ``next`` is the only admissible
action), then reads each episode's last prompt, the question's, from the rows. A perfect reader
answers with the colour of the last announcement about the target visible in that prompt
(:meth:`TrackEnv.read_from_text`), else guesses among the options: an episode scores 1 when
that colour is the target's current one, 0 when it is another, and ``1 / num_choices`` (the
expected value of the guess) when the prompt shows none. No model runs. Two reference rows: the
ideal note (``memory=notes`` with the prompt-only expert writing the target's last announcement
as its note, no window) and chance.

Writes to --out (default outputs/ceilings/<date-time>): ceilings.md (the table, also printed),
ceilings.json (every figure) and one run directory per row and horizon (its summary.json;
its trajectories.jsonl only with --keep-rows: at 100x they are hundreds of MB).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python scripts/ceilings.py` from anywhere
    sys.path.insert(0, str(REPO))

#: The rollout settings every row shares: one episode per seed, many envs per worker.
ROLLOUT = (
    "env=track",
    "policy=random",
    "rollout.group_size=1",
    "rollout.num_workers=1",
    "rollout.num_cpus_per_worker=1",
    "rollout.progress=false",
    "rollout.save_parquet=false",
    "rollout.seed=1000",
)


@dataclass(frozen=True)
class Row:
    """One memory configuration: its name, its label in the table, its Hydra overrides
    (``{B}`` stands for the note's token budget)."""

    name: str
    label: str
    overrides: tuple[str, ...]


#: Every hand-written strategy at its defaults with the note's budget; ``full`` and
#: ``token_budget`` (the window over the whole episode) at that budget are the ``window`` row.
ROWS = (
    Row("none", "none (current observation only)", ("memory=none",)),
    Row(
        "window",
        "window: the newest steps that fit in {B} tokens (= full, token_budget)",
        ("memory=window", "env.history_length=-1", "memory.max_history_tokens={B}"),
    ),
    Row(
        "window_1",
        "window of 1 step",
        ("memory=window", "env.history_length=1", "memory.max_history_tokens={B}"),
    ),
    Row(
        "compaction",
        "extractive compaction (summary {H} tokens), window 1",
        (
            "memory=compaction",
            "env.history_length=1",
            "memory.max_history_tokens={B}",
            "memory.params.summary_max_tokens={H}",
        ),
    ),
    Row(
        "retrieval",
        "retrieval (top 3), window 1",
        ("memory=retrieval", "env.history_length=1", "memory.max_history_tokens={B}"),
    ),
    Row(
        "episodic",
        "episodic (past episodes), window 1",
        ("memory=episodic", "env.history_length=1", "memory.max_history_tokens={B}"),
    ),
    Row(
        "blackboard",
        "blackboard (shared notes), window 1",
        ("memory=blackboard", "env.history_length=1", "memory.max_history_tokens={B}"),
    ),
    Row(
        "conversation",
        "conversation (chat messages in {B} tokens)",
        (
            "memory=conversation",
            "env.formatter=chat",
            "env.history_length=-1",
            "memory.max_history_tokens={B}",
        ),
    ),
    Row(
        "ideal_note",
        "ideal note: the target's last announcement (memory=notes, no window)",
        (
            "memory=notes",
            "env.history_length=0",
            "policy=prompt_oracle",
            "policy.params.memory_tag=memory",
        ),
    ),
)
#: The rows that are hand-written strategies (the design goal bounds them at 10x).
HAND_WRITTEN = tuple(r.name for r in ROWS if r.name != "ideal_note")


def compose(overrides: list[str]) -> Any:
    """The rollout job of configs/config.yaml with ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from agent_memory.config import load_job, register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_job(hydra_compose(config_name="config", overrides=overrides))


def note_tokens() -> int:
    """The note's bound in configs/memory/notes.yaml (``memory.params.note_tokens``)."""
    return int(compose(["memory=notes"]).memory.params["note_tokens"])


def answers(kwargs: dict[str, Any], seeds: set[int]) -> dict[int, tuple[str, int]]:
    """Per seed: the target's current colour at the question and the number of options, from
    the env itself (replayed with the run's env kwargs)."""
    from agent_memory.envs.track import TrackEnv

    env = TrackEnv(**kwargs)
    out = {}
    for seed in seeds:
        _, info = env.reset(seed=seed)
        while info["admissible_actions"] == ["next"]:
            *_, info = env.step("next")
        out[seed] = (env.oracle_action(), len(info["admissible_actions"]))
    return out


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The last row of each episode in ``path`` (trajectories.jsonl): the question's prompt."""
    last: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if '"terminated": true' in line or '"truncated": true' in line:
                row = json.loads(line)
                if row["terminated"] or row["truncated"]:
                    last.append(row)
    return last


def score(rows: list[dict[str, Any]], kwargs: dict[str, Any]) -> dict[str, float]:
    """The perfect reader's expected success over ``rows`` (last rows, one per episode), and
    how many episodes showed the target at all."""
    from agent_memory.envs.track import TrackEnv

    truth = answers(kwargs, {int(r["seed"]) for r in rows})
    total = shown = 0.0
    for row in rows:
        prompt = row["prompt"]  # chat prompts: the messages in order
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        if "what colour is it now?" not in text:
            raise RuntimeError(
                f"episode {row['traj_uid']} ended before its question (step {row['step']}, "
                f"error {row['error']!r}): the ceiling needs every episode's question prompt"
            )
        answer, num_options = truth[int(row["seed"])]
        colour = TrackEnv.read_from_text(text)
        shown += colour is not None
        total += (colour == answer) if colour is not None else 1 / num_options
    n = max(len(rows), 1)
    return {"success": total / n, "shown": shown / n, "episodes": float(len(rows))}


def run_row(
    row: Row,
    horizon: int,
    episodes: int,
    budget: int,
    out: Path,
    keep_rows: bool = False,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Roll ``row`` out at ``horizon`` (``extra``: overrides after the row's) and score its
    question prompts."""
    from agent_memory.rollout import run_rollout

    fill = {"B": str(budget), "H": str(budget // 2)}
    overrides = [o.format(**fill) for o in row.overrides]
    job = compose(
        [
            *ROLLOUT,
            f"rollout.num_groups={episodes}",
            f"rollout.envs_per_worker={min(episodes, 64)}",
            f"env.kwargs.horizon={horizon}",
            *overrides,
            *extra,
        ]
    )
    run_dir = out / f"{row.name}_{horizon}x"
    t0 = time.perf_counter()
    summary = run_rollout(job, run_dir, keep_ray=True, labels={"memory": row.name})
    if summary["status"] != "ok":
        raise RuntimeError(f"{row.name} at {horizon}x: the rollout failed: {summary.get('error')}")
    rows_path = run_dir / "trajectories.jsonl"
    figures = score(read_rows(rows_path), dict(job.env.kwargs))
    if not keep_rows:
        rows_path.unlink()
    return {
        **figures,
        "tokens_mean": float(summary["mean_prompt_tokens"]),
        "tokens_max": float(summary["max_prompt_tokens"]),
        "seconds": time.perf_counter() - t0,
        "overrides": overrides,
    }


def table(results: dict[str, Any]) -> str:
    """The markdown table: success with a perfect reader at each horizon, then prompt tokens
    per step (mean) at each."""
    horizons = results["horizons"]
    head = [*(f"success {h}x" for h in horizons), *(f"tokens/step {h}x" for h in horizons)]
    lines = [f"| memory | {' | '.join(head)} |", "|---" * (len(head) + 1) + "|"]
    budget = results["note_tokens"]
    for row in ROWS:
        if row.name not in results["rows"]:
            continue
        cells = results["rows"][row.name]
        label = row.label.format(B=budget, H=budget // 2)
        success = [f"{100 * cells[str(h)]['success']:.1f}%" for h in horizons]
        tokens = [f"{cells[str(h)]['tokens_mean']:.0f}" for h in horizons]
        lines.append(f"| {label} | {' | '.join([*success, *tokens])} |")
    chance = [f"{100 * results['chance']:.1f}%"] * len(horizons)
    lines.append(f"| chance (1 / num_choices) | {' | '.join([*chance, *['-'] * len(horizons)])} |")
    return "\n".join(lines)


def verdict(results: dict[str, Any], at: int = 10, margin: float = 0.15) -> str:
    """One line: the best hand-written strategy at ``at``x against chance + ``margin``."""
    if str(at) not in next(iter(results["rows"].values()), {}):
        return f"(no {at}x column: the design goal is not checked)"
    hand = {k: v[str(at)]["success"] for k, v in results["rows"].items() if k in HAND_WRITTEN}
    if not hand:
        return "(no hand-written row: the design goal is not checked)"
    best = max(hand, key=lambda k: hand[k])
    bound = results["chance"] + margin
    ok = "holds" if hand[best] <= bound else "FAILS"
    return (
        f"design goal {ok}: the best hand-written strategy at {at}x, {best}, gets "
        f"{100 * hand[best]:.1f}% against chance + {100 * margin:.0f} points = {100 * bound:.1f}%"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the rows at the horizons, write and print the table; returns every figure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every row")
    parser.add_argument("--horizons", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument(
        "--episodes",
        type=int,
        nargs="+",
        default=[100],
        help="episodes per row: one number, or one per horizon",
    )
    parser.add_argument("--note-tokens", type=int, default=None, help="default: notes.yaml's")
    parser.add_argument("--only", nargs="+", choices=[r.name for r in ROWS], default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep-rows", action="store_true", help="keep trajectories.jsonl")
    args = parser.parse_args(argv)
    if min(args.horizons) < 1 or min(args.episodes) < 1:
        parser.error(
            f"--horizons and --episodes must be ints >= 1, got {args.horizons} and {args.episodes}"
        )
    if len(args.episodes) not in (1, len(args.horizons)):
        parser.error(
            f"--episodes takes one number or one per horizon ({len(args.horizons)}), got "
            f"{len(args.episodes)}: {args.episodes}"
        )
    episodes = dict(zip(args.horizons, args.episodes * len(args.horizons), strict=False))
    out = args.out or Path("outputs", "ceilings", time.strftime("%Y-%m-%d/%H-%M-%S"))
    out.mkdir(parents=True, exist_ok=True)
    budget = args.note_tokens if args.note_tokens is not None else note_tokens()
    job = compose([*ROLLOUT, *args.overrides])
    num_choices = int(job.env.kwargs["num_choices"])
    rows = [r for r in ROWS if args.only is None or r.name in args.only]
    results: dict[str, Any] = {
        "command": " ".join(["python scripts/ceilings.py", *(argv or sys.argv[1:])]),
        "horizons": args.horizons,
        "episodes": {str(h): n for h, n in episodes.items()},
        "overrides": args.overrides,
        "note_tokens": budget,
        "env_kwargs": dict(job.env.kwargs),
        "chance": 1 / num_choices,
        "rows": {},
    }
    try:
        for row in rows:
            for horizon in args.horizons:
                cell = run_row(
                    row,
                    horizon,
                    episodes[horizon],
                    budget,
                    out,
                    args.keep_rows,
                    tuple(args.overrides),
                )
                results["rows"].setdefault(row.name, {})[str(horizon)] = cell
                print(
                    f"{row.name} {horizon}x: {100 * cell['success']:.1f}% "
                    f"({cell['tokens_mean']:.0f} tokens/step, {cell['seconds']:.0f} s)",
                    flush=True,
                )
    finally:  # the first rollout started Ray and every one kept it up
        import ray

        ray.shutdown()
    text = f"{table(results)}\n\n{verdict(results)}\n"
    (out / "ceilings.md").write_text(text, encoding="utf-8")
    (out / "ceilings.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(text + f"\noutputs: {out}")
    return results


if __name__ == "__main__":
    main()
