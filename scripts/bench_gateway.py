"""The gateway's added latency and CPU per call, against calling the upstream directly: the
bundled mock server (hash backend, no latency; it answers like vLLM) in a subprocess, the
gateway (``python -m agent_memory.gateway``, fsync per record as by default) in another, and
``--calls`` chat calls at a time ``--concurrency`` from this process with ``httpx``, sent to the
upstream directly or through the gateway. The two runs alternate in this process (the order
swapped each repeat); the table gives the medians of the wall time per call, of the upstream's
CPU per call and of the gateway's, and the ratios (gateway / direct). The gateway's calls ask
the upstream for more (token ids, log-probs, every sampling field) and record them durably:
that is what the ratio measures.

Usage: python scripts/bench_gateway.py [--calls 400] [--concurrency 1] [--repeats 5]
[--no-fsync] (``--quick``: a smoke run of a few seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from mock_server import child_env

REPO = Path(__file__).resolve().parents[1]
HEADERS = {"Content-Type": "application/json"}


def _start(args: list[str], pattern: str) -> tuple[subprocess.Popen[str], str]:
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-m", *args], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(pattern, line)
    if found is None:
        proc.kill()
        raise RuntimeError(f"{args[0]} did not start: {line!r}")
    return proc, found.group(1)


def _cpu(pid: int) -> float:
    """Seconds of CPU process ``pid`` has used (user + system, /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _body(k: int) -> bytes:
    message = {"role": "user", "content": f"Where is box {k}?"}
    return json.dumps({"model": "hash", "messages": [message], "max_tokens": 8, "seed": k}).encode()


async def _run(client: httpx.AsyncClient, url: str, n: int, concurrency: int) -> float:
    """Seconds for ``n`` calls to ``url``, ``concurrency`` at a time."""

    async def one(k: int) -> None:
        response = await client.post(url, content=_body(k), headers=HEADERS)
        response.raise_for_status()
        assert isinstance(response.json()["choices"][0]["message"]["content"], str)

    t0 = time.perf_counter()
    for start in range(0, n, concurrency):
        await asyncio.gather(*(one(k) for k in range(start, min(n, start + concurrency))))
    return time.perf_counter() - t0


async def _bench(args: argparse.Namespace, upstream: str, gateway: str, pids: dict) -> None:
    urls = {
        "direct": f"{upstream}/chat/completions",
        "gateway": f"{gateway}/s/bench/v1/chat/completions",
    }
    limits = httpx.Limits(max_connections=args.concurrency)
    wall: dict[str, list[float]] = {name: [] for name in urls}
    up_cpu: dict[str, list[float]] = {name: [] for name in urls}
    gw_cpu: dict[str, list[float]] = {name: [] for name in urls}
    n = args.calls
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(60.0)) as client:
        for url in urls.values():  # warm-up: connections open, the upstream's log-probs probed
            await _run(client, url, 2 * args.concurrency, args.concurrency)
        for i in range(args.repeats):
            order = list(urls) if i % 2 == 0 else list(reversed(urls))
            for name in order:
                u0, g0 = _cpu(pids["upstream"]), _cpu(pids["gateway"])
                seconds = await _run(client, urls[name], n, args.concurrency)
                wall[name].append(1e3 * seconds / n)
                up_cpu[name].append(1e6 * (_cpu(pids["upstream"]) - u0) / n)
                gw_cpu[name].append(1e6 * (_cpu(pids["gateway"]) - g0) / n)
                print(
                    f"repeat {i + 1}/{args.repeats} {name}: {1e3 * seconds / n:.2f} ms/call",
                    file=sys.stderr,
                    flush=True,
                )
    ms = {k: statistics.median(v) for k, v in wall.items()}
    up = {k: statistics.median(v) for k, v in up_cpu.items()}
    gw = {k: statistics.median(v) for k, v in gw_cpu.items()}
    print(
        f"{n} chat calls per run, {args.concurrency} at a time, mock upstream (hash, no latency); "
        f"medians of {args.repeats} interleaved runs each"
    )
    print()
    print("| path | wall ms/call | upstream CPU us/call | gateway CPU us/call |")
    print("|---|---|---|---|")
    for name in urls:
        print(f"| {name} | {ms[name]:.2f} | {up[name]:,.0f} | {gw[name]:,.0f} |")
    print(
        f"| ratio gateway / direct | {_ratio(ms['gateway'], ms['direct'])} "
        f"| {_ratio(up['gateway'], up['direct'])} | |"
    )
    print(
        f"| added by the gateway | {ms['gateway'] - ms['direct']:.2f} ms "
        f"| {up['gateway'] - up['direct']:,.0f} us | {gw['gateway']:,.0f} us |"
    )


def _ratio(a: float, b: float) -> str:
    """``a / b`` as the table writes it (CPU is counted in clock ticks: a short run's may be 0).

    Example:
        >>> _ratio(3.0, 2.0), _ratio(1.0, 0.0)
        ('1.50x', 'n/a (0 in the baseline: run more --calls)')
    """
    return f"{a / b:.2f}x" if b else "n/a (0 in the baseline: run more --calls)"


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-fsync", action="store_true", help="the gateway flushes, no fsync")
    p.add_argument("--quick", action="store_true", help="100 calls, once")
    args = p.parse_args()
    if args.quick:
        args.calls, args.repeats = 100, 1
    server, upstream = _start(
        ["mock_server.mock_openai", "--hash", "--port", "0", "--max-lifetime", "600"],
        r"at (http://\S+/v1)",
    )
    with tempfile.TemporaryDirectory() as sessions:
        gateway, base = _start(
            [
                "agent_memory.gateway",
                *("--upstream", upstream, "--dir", sessions, "--port", "0"),
                *(["--no-fsync"] if args.no_fsync else []),
            ],
            r"listening on (http://\S+) ",
        )
        try:
            pids = {"upstream": server.pid, "gateway": gateway.pid}
            asyncio.run(_bench(args, upstream, base, pids))
        finally:
            for proc in (gateway, server):
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
