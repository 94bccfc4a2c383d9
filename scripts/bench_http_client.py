"""Benchmark: the openai policy's HTTP transports end to end, the asynchronous engine (Ray
workers, FrozenLake 8x8) against the bundled mock server (scripts/bench_async.py's server: in a
subprocess, log-normal latency, ``--cap`` in flight), each transport's runs beside an ideal
client on the same transport (scripts/bench_async.py's ``Ideal``: one asyncio task per env, no
env, no Ray). Per size and transport, in one process, the runs interleaved (A, B, A, B, ...;
each repeat's order rotated by one): env-steps/s, async ÷ ideal, and the client CPU per env-step
(the driver's and the workers' processes; Ray's daemons not counted), medians and the spread
(min-max) of ``--repeats`` runs. The machine may be shared: the load average is printed.

Usage::

    python scripts/bench_http_client.py                    # docs/benchmarks.md figures
    python scripts/bench_http_client.py --quick            # smoke test (seconds)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from bench_async import Ideal, Run, ServerProcess, Started, load, make_job

from agent_memory.config import PolicyConfig
from agent_memory.policies import make_policy
from agent_memory.rollout.driver.collector import Collector, episode_specs, init_ray

TRANSPORTS = ("http1", "aiohttp")


class Engine(Started):
    """The async engine's collector whose openai policy uses transport ``kind``."""

    def __init__(self, job: Any, kind: str) -> None:
        policy = make_policy("openai", parser=job.env.parser.build(), **job.policy.params)
        policy.http_kind = kind  # type: ignore[attr-defined]
        r = job.rollout
        self.specs = episode_specs(r.num_groups, r.group_size, r.seed)
        self.collector = Collector(job, policy=policy)
        self.collector.start(len(self.specs))


class IdealOn(Ideal):
    """The ideal client, its policy on transport ``kind``."""

    def __init__(self, params: dict[str, Any], envs: int, steps: Any, kind: str) -> None:
        super().__init__(params, envs, steps)
        self.kind = kind

    def play(self, server: ServerProcess | None) -> Run:
        # The ideal's policy is made in this process: its runtime reads the transport here.
        before = os.environ.get("AGENT_MEMORY_HTTP")
        os.environ["AGENT_MEMORY_HTTP"] = self.kind
        try:
            return super().play(server)
        finally:
            if before is None:
                del os.environ["AGENT_MEMORY_HTTP"]
            else:
                os.environ["AGENT_MEMORY_HTTP"] = before


def spread(runs: list[Run], f: Any) -> str:
    values = [f(r) for r in runs]
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def size(args: argparse.Namespace, server: ServerProcess, policy: PolicyConfig, n: int) -> None:
    per_worker = -(-n // args.workers)
    job = make_job(
        "async", policy, n * args.episodes_per_env, args.workers, per_worker, args.max_steps
    )
    engines: dict[str, Any] = {}
    runs: dict[str, list[Run]] = {}
    try:
        for kind in TRANSPORTS:
            engines[f"async {kind}"] = Engine(job, kind)
        first = f"async {TRANSPORTS[0]}"
        for kind in TRANSPORTS:
            engines[f"ideal {kind}"] = IdealOn(
                dict(policy.params), n, lambda: runs[first][0].steps, kind
            )
        order = [f"{mode} {kind}" for kind in TRANSPORTS for mode in ("async", "ideal")]
        order = [order[0], order[2], order[1], order[3]]  # A, B, A, B
        runs = {key: [] for key in order}
        for r in range(args.repeats):
            k = r % len(order)
            for key in order[k:] + order[:k]:
                runs[key].append(engines[key].play(server))
            print(
                f"  ({n} envs: repeat {r + 1} of {args.repeats} done; load {load()})",
                file=sys.stderr,
            )
    finally:
        for engine in engines.values():
            engine.close()
    for kind in TRANSPORTS:
        a, i = runs[f"async {kind}"], runs[f"ideal {kind}"]
        ratios = [x.steps_per_s / y.steps_per_s for x, y in zip(a, i)]
        print(
            f"| {n} | {kind} | {statistics.median(r.steps_per_s for r in a):,.0f} | "
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) | "
            f"{spread(a, lambda r: r.client_cpu_s / r.steps * 1000)} | "
            f"{spread(i, lambda r: r.client_cpu_s / r.steps * 1000)} | "
            f"{statistics.median(r.utilization for r in a):.2f} |"
        )
    cpu = {
        k: statistics.median(r.client_cpu_s / r.steps for r in runs[f"async {k}"])
        for k in TRANSPORTS
    }
    print(
        f"| {n} | aiohttp ÷ http1, client CPU per env-step | {cpu['aiohttp'] / cpu['http1']:.2f} | | | | |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny budgets (smoke test)")
    p.add_argument("--envs", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--episodes-per-env", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=4, help="episode step limit")
    p.add_argument("--latency-median", type=float, default=0.05, help="seconds")
    p.add_argument("--latency-p99", type=float, default=1.0, help="seconds")
    p.add_argument("--cap", type=int, default=64, help="the server's max_in_flight")
    p.add_argument("--server-lifetime", type=float, default=3600.0, help="seconds, then it stops")
    args = p.parse_args()
    if args.quick:
        args.envs, args.repeats, args.server_lifetime = [8], 1, 300.0
    init_ray()
    print(f"load average (1, 5, 15 min) at the start: {load()}\n")
    server = ServerProcess(args.latency_median, args.latency_p99, args.cap, args.server_lifetime)
    try:
        policy = PolicyConfig(
            name="openai",
            params={
                "base_url": server.base_url,
                "model": "hash",
                "seed": 0,
                "concurrency": 2 * args.cap,
                "timeout": 60.0,
                "max_retries": 2,
            },
        )
        print(
            f"The async engine and the ideal client per transport (mock server: log-normal "
            f"latency median {args.latency_median * 1000:.0f} ms, p99 {args.latency_p99:g} s, "
            f"{args.cap} in flight; client concurrency {2 * args.cap}; {args.workers} workers; "
            f"{args.episodes_per_env} episode(s) of at most {args.max_steps} steps per env; "
            f"medians (min-max) of {args.repeats} interleaved runs)\n"
        )
        print(
            "| envs | transport | env-steps/s | async ÷ ideal | client CPU per env-step, async "
            "(ms) | client CPU per env-step, ideal (ms) | server utilization |"
        )
        print("|---|---|---|---|---|---|---|")
        for n in args.envs:
            size(args, server, policy, n)
    finally:
        server.close()
    print(f"\nload average (1, 5, 15 min) at the end: {load()}")


if __name__ == "__main__":
    main()
