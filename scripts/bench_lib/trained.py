"""The command line the training benchmarks share (bench_learning, bench_notes, bench_horizon):
choose configurations, train them (one after another on one Ray instance, or ``--jobs`` at a time
in processes of their own), write the table and the plot."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
#: What a configuration's process leaves for the table: ``<out>/<name>/result.json``.
RESULT = "result.json"


def positive(text: str) -> int:
    """An integer >= 1 from the command line (argparse's ``type``).

    Example:
        >>> positive("10")
        10
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


@dataclass(frozen=True)
class Option:
    """A command-line option of one benchmark (``flag`` and ``argparse`` keyword arguments), given
    to each configuration's process as the parent parsed it."""

    flag: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def forward(self, args: argparse.Namespace) -> list[str]:
        """The option as parsed in ``args``, written back as command-line words ([] when unset or
        left at its default).

        Example:
            >>> o = Option("--horizons", {"nargs": "+", "type": int, "default": [1, 10]})
            >>> o.forward(argparse.Namespace(horizons=[1, 2]))
            ['--horizons', '1', '2']
            >>> o.forward(argparse.Namespace(horizons=[1, 10]))
            []
        """
        value = getattr(args, self.flag.lstrip("-").replace("-", "_"))
        if value is None or value == self.kwargs.get("default"):
            return []
        return [self.flag, *(str(v) for v in (value if isinstance(value, list) else [value]))]


def run_benchmark(
    script: str,
    doc: str,
    settings: Sequence[Any],
    quick: Sequence[str],
    run_one: Callable[[Any, Path, list[str], argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
    table: Callable[[list[dict[str, Any]], argparse.Namespace], str],
    plot: Callable[[list[dict[str, Any]], Path, argparse.Namespace], None],
    name: str,
    check: Callable[[Any, list[str]], Any],
    prepare: Callable[[Path, list[str]], list[str]] | None = None,
    options: Sequence[Option] = (),
    overrides: Callable[[argparse.Namespace], list[str]] | None = None,
) -> None:
    """Parse ``--only/--out/--quick/--set/--jobs``, train the chosen ``settings`` (``run_one``),
    print each result (``report``), and write ``<name>.md`` (the table and the command that
    produced it), ``<name>.json`` (each configuration's figures) and ``<name>.png`` into the output
    directory. ``check(setting, extra)`` composes (and may check further) a configuration's
    config: every chosen one is checked before Ray or a child process starts, and a config
    error ends the run there (one message, exit status 2).
    ``prepare(out, extra)``, run once before any configuration, returns more overrides for
    all of them (e.g. the model they all start from). ``options`` are the benchmark's own
    command-line options (given to ``run_one``, ``table`` and ``plot`` in the parsed arguments,
    and to each configuration's process); ``overrides(args)`` turns them into Hydra overrides
    for every configuration, before ``--quick``'s and ``--set``'s (which win)."""
    parser = _parser(doc, settings, options)
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error(f"--jobs: expected an integer >= 1, got {args.jobs}")
    own = [*(overrides(args) if overrides is not None else ())]
    extra = [*own, *(quick if args.quick else ()), *args.set]
    chosen = [s for s in settings if not args.only or s.name in args.only]
    if not args.child:  # a child's configuration was checked by its parent
        from agent_memory.cli import report_config_errors

        report_config_errors(lambda: [check(setting, extra) for setting in chosen])
    out = args.out or REPO / "outputs" / f"bench_{name}" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    given = list(args.set)
    if prepare is not None and not args.child:  # a child has its parent's overrides in --set
        added = prepare(out, extra)
        extra += added
        given += added
    forwarded = [word for option in options for word in option.forward(args)]
    flags = [
        *(["--quick"] if args.quick else []),
        *forwarded,
        *(["--set", *given] if given else []),
    ]

    failed: list[str] = []
    if args.jobs > 1 and len(chosen) > 1:
        results, failed = _in_processes(script, chosen, out, flags, args.jobs, report)
    else:
        results = _in_turn(chosen, out, extra, args, run_one, report)
    if args.child:
        return
    _write(out, name, script, results, args, forwarded, table, plot)
    if failed:  # what finished is written; the run still fails
        sys.exit(f"configurations failed: {', '.join(failed)}")


def _parser(
    doc: str, settings: Sequence[Any], options: Sequence[Option]
) -> argparse.ArgumentParser:
    """The command line of a benchmark with ``settings`` and its own ``options``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[s.name for s in settings],
        help="run these configurations only",
    )
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    parser.add_argument("--quick", action="store_true", help="2 iterations each (a smoke test)")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra overrides for every configuration",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="configurations trained at once, each in a process (and Ray "
        "instance) of its own; 1: one after another",
    )
    for option in options:
        parser.add_argument(option.flag, **option.kwargs)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser


def _write(
    out: Path,
    name: str,
    script: str,
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    forwarded: list[str],
    table: Callable[[list[dict[str, Any]], argparse.Namespace], str],
    plot: Callable[[list[dict[str, Any]], Path, argparse.Namespace], None],
) -> None:
    """Write ``<name>.md`` (the table and the command that produced it), ``<name>.png`` and
    ``<name>.json`` into ``out``, and print the table."""
    text = table(results, args)
    shown = [
        *(["--quick"] if args.quick else []),
        *(["--only", *args.only] if args.only else []),
        *forwarded,
        *(["--set", *args.set] if args.set else []),
        *(["--jobs", str(args.jobs)] if args.jobs > 1 else []),
    ]
    command = " ".join(["python", f"scripts/{script}", *shown])
    (out / f"{name}.md").write_text(f"{text}\n\nProduced by: `{command}`\n")
    plot(results, out / f"{name}.png", args)
    rows = [
        {"name": r["setting"].name, "label": r["setting"].label}
        | {k: v for k, v in r.items() if k != "setting"}
        for r in results
    ]
    (out / f"{name}.json").write_text(json.dumps(rows, indent=2) + "\n")
    print()
    print(text)
    print(f"\ntable: {out / f'{name}.md'}\nplot: {out / f'{name}.png'}")
    print(f"figures: {out / f'{name}.json'}")


def _in_turn(
    chosen: Sequence[Any],
    out: Path,
    extra: list[str],
    args: argparse.Namespace,
    run_one: Callable[[Any, Path, list[str], argparse.Namespace], dict[str, Any]],
    report: Callable[[dict[str, Any]], str],
) -> list[dict[str, Any]]:
    """Each configuration in this process, on one Ray instance (a child process also writes its
    result.json)."""
    from agent_memory.rollout.driver.cluster import init_ray, stop_ray

    started = init_ray()
    results = []
    try:
        for setting in chosen:
            print(f"training: {setting.label}", flush=True)
            results.append(run_one(setting, out, extra, args))
            print(f"  {report(results[-1])}", flush=True)
            if args.child:
                saved = {k: v for k, v in results[-1].items() if k != "setting"}
                (out / setting.name / RESULT).write_text(json.dumps(saved, indent=2))
    finally:
        if started:
            stop_ray()
    return results


def _in_processes(
    script: str,
    chosen: Sequence[Any],
    out: Path,
    flags: list[str],
    jobs: int,
    report: Callable[[dict[str, Any]], str],
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each configuration in a process of its own, ``jobs`` at a time: the results of those that
    finished (in order) and a line for each that failed (its log named)."""
    waiting = list(chosen)
    running: dict[str, tuple[Any, subprocess.Popen[bytes], Any]] = {}
    failed = []
    while waiting or running:
        while waiting and len(running) < jobs:
            setting = waiting.pop(0)
            (out / setting.name).mkdir(parents=True, exist_ok=True)
            log = (out / setting.name / "bench.log").open("w")
            cmd = [
                sys.executable,
                str(REPO / "scripts" / script),
                "--child",
                "--only",
                setting.name,
                "--out",
                str(out),
                *flags,
            ]
            print(f"training: {setting.label} (log: {log.name})", flush=True)
            running[setting.name] = (setting, subprocess.Popen(cmd, stdout=log, stderr=log), log)
            time.sleep(3)  # one Ray instance starting at a time (spreads the start-up load)
        time.sleep(1)
        for key, (setting, proc, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[key]
            if proc.returncode != 0:
                failed.append(f"{setting.name} (exit {proc.returncode}, log: {log.name})")
            else:
                result = json.loads((out / setting.name / RESULT).read_text())
                print(f"  {setting.label}: {report(result)}", flush=True)
    results = []
    for setting in chosen:
        path = out / setting.name / RESULT
        if path.is_file() and not any(f.startswith(f"{setting.name} ") for f in failed):
            results.append({**json.loads(path.read_text()), "setting": setting})
    return results, failed
