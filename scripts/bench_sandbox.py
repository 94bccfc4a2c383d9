"""Benchmark: what the Code env's sandbox costs per step and at start-up, hardened vs before.

Same process, interleaved rounds, medians:

* ``hardened``: every layer on (the default ``Sandbox``): seccomp, dropped privileges, the
  private file-system view, the cgroup, network namespace, Landlock, rlimits, audit hook;
* ``pre-change layers``: only the layers the sandbox had before the hardening issue (network
  namespace, Landlock, rlimits, audit hook): seccomp, privileges, private view and cgroup
  switched off through the constructor. Both run the supervisor/runner process pair, whose
  extra pipe hop is part of the per-step figure of both.

Per step: wall time of ``Sandbox.run`` on a trivial snippet (``x = 1``), after a warm-up run.
Start-up: from the constructor (working dir, cgroup) to "ready"; close: kill, reap, remove the
working dir and the cgroup; both on fresh sandboxes.

Usage::

    python scripts/bench_sandbox.py                          # README figures (~1 minute)
    python scripts/bench_sandbox.py --rounds 1 --runs 5      # smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time

from agent_memory.envs.code_exec import Sandbox, SandboxLimits

VARIANTS: dict[str, dict[str, bool]] = {
    "hardened": {},
    "pre-change layers": {
        "seccomp": False,
        "drop_privileges": False,
        "private_fs": False,
        "cgroup": False,
    },
}


def one_round(switches: dict[str, bool], runs: int, snippet: str) -> tuple[float, float, list]:
    """``(start-up s, close s, per-run seconds)`` of one fresh sandbox."""
    t0 = time.perf_counter()
    box = Sandbox(SandboxLimits(timeout_s=30.0), **switches)
    box.layers  # noqa: B018  (waits for "ready")
    boot = time.perf_counter() - t0
    box.run(snippet)  # warm-up
    per_run = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = box.run(snippet)
        per_run.append(time.perf_counter() - t0)
        if result.status != "ok":
            raise RuntimeError(f"the snippet failed: {result.text}{result.note}")
    t0 = time.perf_counter()
    box.close()
    return boot, time.perf_counter() - t0, per_run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15, help="fresh sandboxes per variant")
    p.add_argument("--runs", type=int, default=200, help="timed runs per sandbox")
    p.add_argument("--snippet", default="x = 1", help="the code each run executes")
    args = p.parse_args()

    results: dict[str, dict[str, list[float]]] = {
        name: {"boot": [], "close": [], "run": []} for name in VARIANTS
    }
    for _ in range(args.rounds):
        for name, switches in VARIANTS.items():  # interleaved: drift hits both alike
            boot, close, per_run = one_round(switches, args.runs, args.snippet)
            results[name]["boot"].append(boot)
            results[name]["close"].append(close)
            results[name]["run"].extend(per_run)

    with Sandbox() as box:
        layers = box.layers
    med = {n: {k: statistics.median(v) * 1000 for k, v in r.items()} for n, r in results.items()}
    base = med["pre-change layers"]
    print(
        f"Sandbox cost: {args.rounds} sandboxes per variant, {args.runs} runs of "
        f"{args.snippet!r} each (medians)\n"
    )
    print(
        "| variant | per step (ms) | start-up (ms) | close (ms) | per step / before |"
        " start-up / before |"
    )
    print("|---|---|---|---|---|---|")
    for name, m in med.items():
        print(
            f"| {name} | {m['run']:.3f} | {m['boot']:.1f} | {m['close']:.1f} | "
            f"{m['run'] / base['run']:.2f}x | {m['boot'] / base['boot']:.2f}x |"
        )
    print("\nLayers of the hardened sandbox here:")
    for name, state in layers.items():
        print(f"- {name}: {state.split(' (')[0]}")


if __name__ == "__main__":
    main()
