"""The command line both training benchmarks share (bench_learning, bench_notes): choose
configurations, train them one after another on one Ray instance, write the table and the plot."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_benchmark(
    script: str,
    doc: str,
    settings: Sequence[Any],
    quick: Sequence[str],
    run_one: Callable[[Any, Path, list[str]], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    table: Callable[[list[dict[str, Any]]], str],
    plot: Callable[[list[dict[str, Any]], Path], None],
    name: str,
) -> None:
    """Parse ``--only/--out/--quick/--set``, train the chosen ``settings`` (``run_one``), print
    each result (``report``), and write ``<name>.md`` (the table and the command that produced
    it) and ``<name>.png`` into the output directory."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=[s.name for s in settings],
                        help="run these configurations only")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--quick", action="store_true", help="2 iterations each (a smoke test)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra Hydra overrides for every configuration")  # fmt: skip
    args = parser.parse_args()
    out = args.out or REPO / "outputs" / f"bench_{name}" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    extra = [*(quick if args.quick else ()), *args.set]
    chosen = [s for s in settings if not args.only or s.name in args.only]

    from agent_memory.rollout.driver.cluster import init_ray, stop_ray

    started = init_ray()  # one Ray instance for every configuration
    results = []
    try:
        for setting in chosen:
            print(f"training: {setting.label}", flush=True)
            results.append(run_one(setting, out, extra))
            print(f"  {report(results[-1])}", flush=True)
    finally:
        if started:
            stop_ray()
    text = table(results)
    flags = [
        *(["--quick"] if args.quick else []),
        *(["--only", *args.only] if args.only else []),
        *(["--set", *args.set] if args.set else []),
    ]
    command = " ".join(["python", f"scripts/{script}", *flags])
    (out / f"{name}.md").write_text(f"{text}\n\nProduced by: `{command}`\n")
    plot(results, out / f"{name}.png")
    print()
    print(text)
    print(f"\ntable: {out / f'{name}.md'}\nplot: {out / f'{name}.png'}")
