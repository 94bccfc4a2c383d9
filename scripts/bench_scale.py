"""Benchmark: the asynchronous engine from a thousand envs to 131,072, on 2 Ray workers.

Random policy on Recall with 3 distractors (every episode is 5 steps), the envs split over the
workers, every env playing from the start. Each size plays at least ``--min-episodes`` episodes
(one or more per env), and is run right after a baseline run of ``--baseline`` envs, so each
ratio compares two runs made minutes apart on the same machine.

Columns: *set-up* is the seconds before the first step (the workers build their envs); env-steps/s
counts the collect's loop only; peak memory is each process's VmHWM (the driver's is its peak so
far in this process: the sizes run in increasing order).

Usage::

    python scripts/bench_scale.py                  # the figures in docs/benchmarks.md (~12 min)
    python scripts/bench_scale.py --quick          # smoke test
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass

from bench_lib.procs import vm_hwm_mib

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.config import AlgoConfig, EnvConfig, JobConfig, PolicyConfig, RolloutConfig
from agent_memory.rollout.driver.collector import Collector, episode_specs, init_ray


@dataclass
class Run:
    envs: int
    episodes_per_env: int
    env_steps: int
    setup_s: float
    rate: float
    workers_mib: list[float]
    driver_mib: float


def play(envs: int, workers: int, min_episodes: int) -> Run:
    """One collect of ``envs`` envs over ``workers`` workers, at least ``min_episodes``
    episodes (the same number on every env); the workers end with it."""
    per_env = max(1, math.ceil(min_episodes / envs))
    job = JobConfig(
        env=EnvConfig(id="agent_memory/Recall-v0", kwargs={"num_distractors": 3}),
        policy=PolicyConfig(name="random"),
        rollout=RolloutConfig(
            num_groups=envs * per_env,
            group_size=1,
            num_workers=workers,
            envs_per_worker=envs // workers,
            num_cpus_per_worker=0.5,
            progress=False,
            save_parquet=False,
        ),
        algo=AlgoConfig(),
    )
    r = job.rollout
    t0 = time.perf_counter()
    collector = Collector(job)
    try:  # Collector.run's steps, with the workers' memory read before they end
        specs = episode_specs(r.num_groups, r.group_size, r.seed)
        collector.start(len(specs))
        collector.collect(specs)
        wall = time.perf_counter() - t0
        s = collector.stats
        workers_mib = [vm_hwm_mib(collector.worker_pid(w)) for w in range(workers)]
    finally:
        collector.close()
    return Run(
        envs,
        per_env,
        s.env_steps,
        wall - s.loop_time,
        s.env_steps / s.loop_time,
        workers_mib,
        vm_hwm_mib(os.getpid()),
    )


def row(run: Run, base: Run | None) -> str:
    ratio = "1.00x" if base is None else f"{run.rate / base.rate:.2f}x (baseline {base.rate:,.0f})"
    mem = " / ".join(f"{m:,.0f}" for m in run.workers_mib)
    return (
        f"| {run.envs:,} | {run.episodes_per_env} | {run.env_steps:,} | {run.setup_s:.1f} s | "
        f"{run.rate:,.0f} | {ratio} | {mem} MiB | {run.driver_mib:,.0f} MiB |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--envs",
        type=int,
        nargs="+",
        default=[8192, 32768, 131072],
        help="the sizes measured against the baseline, in increasing order",
    )
    p.add_argument("--baseline", type=int, default=1024, help="envs of the baseline runs")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument(
        "--min-episodes",
        type=int,
        default=16384,
        help="each run plays at least this many episodes (1 or more per env)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    args = p.parse_args()
    if args.quick:
        args.envs, args.baseline, args.min_episodes = [256], 64, 256
    for n in [args.baseline, *args.envs]:
        if n % args.workers:
            p.error(
                f"--envs and --baseline: expected multiples of --workers={args.workers}, got {n}"
            )
    init_ray()
    load = os.getloadavg()[0]
    print(
        f"Recall, 5-step episodes, random policy, {args.workers} workers; each size right after "
        f"a baseline run of {args.baseline:,} envs (load average {load:.2f} at the start)\n"
    )
    print(
        "| envs | episodes per env | env-steps | set-up | env-steps/s | vs the baseline run "
        "before it | peak memory per worker | driver's peak so far |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in args.envs:
        base = play(args.baseline, args.workers, args.min_episodes)
        print(row(base, None), flush=True)
        print(row(play(n, args.workers, args.min_episodes), base), flush=True)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
