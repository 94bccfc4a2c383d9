"""Load generator: how many requests per second the mock server sustains.

``connections`` keep-alive connections send requests back to back for ``duration_s``. The CLI
(``python -m mock_server.loadgen --connections 64``) runs the server in its own process.

Example:
    >>> from mock_server import HashBackend, MockOpenAIServer
    >>> with MockOpenAIServer(HashBackend()) as server:
    ...     result = run_load(server.port, connections=4, duration_s=0.2)
    >>> result.errors, result.requests > 0
    (0, True)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from mock_server import child_env
from mock_server.http11 import HOST

__all__ = ["LoadResult", "main", "run_load"]

_BODY = {
    "model": "hash",
    "prompt": "you see a box and a door",
    "max_tokens": 16,
    "logprobs": 0,
    "return_token_ids": True,
    "seed": 1,
}


@dataclass(frozen=True)
class LoadResult:
    """What one load run measured (client side)."""

    connections: int
    seconds: float
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float

    @property
    def requests_per_s(self) -> float:
        """Answered requests per second."""
        return self.requests / self.seconds


async def _worker(port: int, request: bytes, deadline: float, out: list[float]) -> int:
    reader, writer = await asyncio.open_connection(HOST, port)
    errors = 0
    try:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"content-length: *(\d+)", head, re.I).group(1))  # type: ignore[union-attr]
            await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                errors += 1
            out.append(time.perf_counter() - t0)
    finally:
        writer.close()
    return errors


async def _load(
    port: int, connections: int, duration_s: float, path: str, body: dict
) -> LoadResult:
    data = json.dumps(body).encode()
    request = (
        f"POST {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + duration_s
    errors = await asyncio.gather(
        *(_worker(port, request, deadline, latencies) for _ in range(connections))
    )
    seconds = time.perf_counter() - start
    ordered = sorted(latencies) or [float("nan")]
    return LoadResult(
        connections=connections,
        seconds=seconds,
        requests=len(latencies),
        errors=sum(errors),
        p50_ms=1000 * ordered[len(ordered) // 2],
        p99_ms=1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    )


def run_load(
    port: int,
    *,
    connections: int = 64,
    duration_s: float = 5.0,
    path: str = "/v1/completions",
    body: dict | None = None,
) -> LoadResult:
    """Drive a server on ``127.0.0.1:port`` (runs its own event loop; call from a plain thread).

    Args:
        port: the server's port.
        connections: concurrent keep-alive connections, one request outstanding on each.
        duration_s, path, body: how long to send, where, and what (default: a short completion).
    """
    return asyncio.run(_load(port, connections, duration_s, path, body or _BODY))


def main(argv: list[str] | None = None) -> int:
    """Start ``mock_openai --hash`` in a subprocess, load it, print requests/s."""
    p = argparse.ArgumentParser(prog="python -m mock_server.loadgen")
    p.add_argument("--connections", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--dialect", choices=["vllm", "sglang"], default="vllm")
    args = p.parse_args(argv)
    cmd = [
        sys.executable,
        "-m",
        "mock_server.mock_openai",
        "--hash",
        "--port",
        "0",
        "--max-in-flight",
        "4096",
        "--dialect",
        args.dialect,
        "--max-lifetime",
        str(60 + args.duration * 2 * len(args.connections)),
    ]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=child_env())
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        if match is None:
            raise RuntimeError(f"the server did not start: {line!r}")
        port = int(match.group(1))
        print(f"server: {' '.join(cmd[1:])} (zero latency, hash backend)")
        for n in args.connections:
            run_load(port, connections=n, duration_s=0.5)  # warm up the connections' path
            r = run_load(port, connections=n, duration_s=args.duration)
            print(
                f"connections={n:4d}  {r.requests_per_s:8.0f} req/s  "
                f"p50 {r.p50_ms:6.2f} ms  p99 {r.p99_ms:6.2f} ms  errors {r.errors}",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
