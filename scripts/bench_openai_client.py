"""The openai policy's client cost against a bare ``httpx.AsyncClient``: ``--concurrency``
single-prompt requests at once on one event loop (what a rollout worker does), ``--rounds`` times,
against the bundled mock server (hash backend, no latency) in a subprocess. The baseline POSTs
the policy's request body with httpx's default transport, one task per request in flight (what a
user would write with httpx directly); the policy runs ``agenerate``. Baseline and policy runs
alternate in this process (the order swapped each repeat); the table gives the medians of the
client process's CPU per request (``time.process_time``: every thread of this process) and of
the requests per second, and the ratio policy / baseline of each.

Usage: python scripts/bench_openai_client.py [--concurrency 256] [--rounds 5] [--repeats 5]
(``--quick``: a smoke run of a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from mock_server import child_env

from agent_memory.policies.base import episode_seed
from agent_memory.policies.openai_client import OpenAIPolicy

SEED = 0
HEADERS = {"Content-Type": "application/json"}


def _serve(max_in_flight: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mock_server.mock_openai",
            "--hash",
            "--port",
            "0",
            "--max-in-flight",
            str(max_in_flight),
            "--max-lifetime",
            "600",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"at (http://\S+/v1)", line)
    if found is None:
        proc.kill()
        raise RuntimeError(f"the mock server did not start: {line!r}")
    return proc, found.group(1)


def _meta(k: int) -> dict[str, Any]:
    return {"traj_uid": f"t{k}", "step": 0}


def _policy_request(policy: OpenAIPolicy) -> Callable[[int], Awaitable[None]]:
    async def one(k: int) -> None:
        (g,) = await policy.agenerate([f"prompt {k}"], [_meta(k)])
        assert g.finish_reason != "error", policy.last_errors

    return one


def _baseline_request(
    client: httpx.AsyncClient, policy: OpenAIPolicy
) -> Callable[[int], Awaitable[None]]:
    """One request as a user would send it with httpx: the policy's body (a chat completion:
    its fields, this prompt as the user's message, the episode's seed) encoded per request, the
    answer's text read."""
    template = json.loads(policy._requests(["prompt 0"], [_meta(0)])[0].body)

    def body(k: int) -> bytes:
        message = {"role": "user", "content": f"prompt {k}"}
        seed = episode_seed(SEED, f"t{k}", 0)
        return json.dumps({**template, "messages": [message], "seed": seed}).encode()

    for k in (0, 7):  # byte for byte what the policy sends
        assert body(k) == policy._requests([f"prompt {k}"], [_meta(k)])[0].body, k

    async def one(k: int) -> None:
        response = await client.post(policy.url, content=body(k), headers=HEADERS)
        response.raise_for_status()
        assert isinstance(response.json()["choices"][0]["message"]["content"], str)

    return one


async def _rounds(
    one: Callable[[int], Awaitable[None]], concurrency: int, rounds: int
) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    for r in range(rounds):
        await asyncio.gather(*(one(r * concurrency + k) for k in range(concurrency)))
    return time.perf_counter() - t0, time.process_time() - c0


async def _bench(policy: OpenAIPolicy, args: argparse.Namespace) -> None:
    limits = httpx.Limits(
        max_connections=args.concurrency, max_keepalive_connections=args.concurrency
    )
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0)) as client:
        clients = {
            "baseline": _baseline_request(client, policy),
            "policy": _policy_request(policy),
        }
        for one in clients.values():  # warm-up: connections open, server checked
            await _rounds(one, args.concurrency, 2)
        n = args.concurrency * args.rounds
        cpu: dict[str, list[float]] = {name: [] for name in clients}
        rate: dict[str, list[float]] = {name: [] for name in clients}
        for i in range(args.repeats):
            order = list(clients) if i % 2 == 0 else list(reversed(clients))
            for name in order:
                wall, seconds = await _rounds(clients[name], args.concurrency, args.rounds)
                cpu[name].append(1e6 * seconds / n)
                rate[name].append(n / wall)
                print(
                    f"repeat {i + 1}/{args.repeats} {name}: {n / wall:,.0f} requests/s, "
                    f"{1e6 * seconds / n:,.0f} us CPU/request",
                    file=sys.stderr,
                    flush=True,
                )
    us = {name: statistics.median(v) for name, v in cpu.items()}
    rps = {name: statistics.median(v) for name, v in rate.items()}
    print(
        f"{n} requests per run, {args.concurrency} in flight, mock server (hash, no latency); "
        f"medians of {args.repeats} interleaved runs each"
    )
    print()
    print("| client | client CPU us/request | requests/s |")
    print("|---|---|---|")
    print(f"| baseline: bare httpx.AsyncClient | {us['baseline']:,.0f} | {rps['baseline']:,.0f} |")
    print(f"| policy: OpenAIPolicy.agenerate | {us['policy']:,.0f} | {rps['policy']:,.0f} |")
    print(
        f"| ratio policy / baseline | {us['policy'] / us['baseline']:.2f}x "
        f"| {rps['policy'] / rps['baseline']:.2f}x |"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="32 in flight, 2 rounds, once")
    args = p.parse_args()
    if args.quick:
        args.concurrency, args.rounds, args.repeats = 32, 2, 1
    proc, url = _serve(args.concurrency)
    try:
        policy = OpenAIPolicy(
            url, "hash", concurrency=args.concurrency, return_tokens=False, max_tokens=8, seed=SEED
        )
        with policy:
            asyncio.run(_bench(policy, args))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
