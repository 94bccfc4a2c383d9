"""Latency, capacity and lifetime of the mock server: the numbers the async-rollout benchmark
relies on (requests in flight, utilization, idle time) and its time bound."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest
from mock_server import (
    FixedLatency,
    HashBackend,
    LogNormalLatency,
    MockOpenAIServer,
    child_env,
    digest_answer,
)
from mock_server.latency import Z99

from tests.serving.helpers import call


def test_lognormal_latency_has_the_asked_median_and_p99():
    latency = LogNormalLatency(median_s=0.05, p99_s=1.0, seed=0)
    assert latency.sigma == pytest.approx(math.log(20) / 2.3263, rel=1e-4)
    assert statistics.NormalDist().inv_cdf(0.99) == pytest.approx(Z99)
    xs = sorted(latency.samples(2000))
    # 2000 draws: the median is within ~4% (1 s.e.), the p99 within ~11% (1 s.e.); 3 s.e. here.
    assert 0.044 < xs[1000] < 0.056
    assert 0.7 < xs[1980] < 1.4
    assert LogNormalLatency(seed=3).samples(5) == LogNormalLatency(seed=3).samples(5)
    assert FixedLatency(0.2).sample() == 0.2
    assert LogNormalLatency(0.05, 0.05).sample() == pytest.approx(0.05)  # p99 == median: constant
    with pytest.raises(ValueError, match=re.escape("p99_s must be a number >= 0.05, got 0.01")):
        LogNormalLatency(median_s=0.05, p99_s=0.01)
    with pytest.raises(ValueError, match=re.escape("median_s must be a number > 0, got 0")):
        LogNormalLatency(median_s=0)


class _Gated(HashBackend):
    """A :class:`HashBackend` whose answers wait for ``gate`` (in the server's worker thread, so
    the requests holding a slot keep it while the others arrive and queue)."""

    blocking = True

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def generate(self, request):
        assert self.gate.wait(60), "the test never opened the gate"
        return super().generate(request)


def test_concurrency_cap_holds_and_in_flight_time_is_accounted():
    cap, n, service = 4, 12, 0.2
    gate = threading.Event()  # the first wave holds its slots until every request has arrived
    server = MockOpenAIServer(_Gated(gate), latency=FixedLatency(service), max_in_flight=cap)
    barrier = threading.Barrier(n)
    statuses = []

    def one(i):
        barrier.wait()
        statuses.append(call(server.base_url + "/completions", {"prompt": f"go {i}"})[0])

    with server:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        t0 = time.monotonic()
        try:
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60  # a hang guard, not a timing
            while (queued := server.stats()).peak_waiting < n - cap:
                assert time.monotonic() < deadline, f"the requests never all arrived: {queued}"
                time.sleep(0.01)
        finally:
            gate.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        whole = server.stats()
    assert statuses == [200] * n
    # While n - cap requests were queued, every slot was busy (counted by the server, no clock).
    assert queued.timeline[-1][1] == queued.peak_in_flight == cap
    # The cap: 12 requests of 0.2 s through 4 slots take at least 3 rounds (a lower bound).
    assert elapsed >= (n // cap) * service
    assert whole.peak_in_flight == cap and whole.requests == n and whole.errors == 0
    steps = [b - a for (_, a), (_, b) in zip(whole.timeline, whole.timeline[1:], strict=False)]
    assert set(steps) <= {-1, 1} and max(c for _, c in whole.timeline) == cap
    # Each request took a slot once and gave it back once: n rises, n falls, back to 0.
    assert steps.count(1) == steps.count(-1) == n and whole.timeline[-1][1] == 0
    assert whole.peak_waiting == n - cap and whole.mean_wait_s > 0  # queued (not refused)
    # Time-weighted in-flight area = the sum of each request's slot time: the times slots were
    # given back minus the times they were taken (waiting is not in flight), each >= 0.2 s.
    area = whole.mean_in_flight * whole.duration_s
    pairs = list(zip(whole.timeline, whole.timeline[1:], strict=False))
    taken = sum(b[0] for a, b in pairs if b[1] > a[1])
    given_back = sum(b[0] for a, b in pairs if b[1] < a[1])
    assert area == pytest.approx(given_back - taken) and area >= n * service
    first, last = whole.timeline[1][0], whole.timeline[-1][0]
    busy = server.stats(since=first, until=last)
    assert busy.mean_in_flight == pytest.approx(area / (last - first))
    assert busy.utilization == pytest.approx(busy.mean_in_flight / cap)
    # Idle: before the first and after the last request, plus any instant between a wave's end
    # and the next wave's start (the queued requests take their slots one loop turn later; how
    # long that is, is scripts/bench_async.py's calibration figure, not a test's).
    outside = whole.duration_s - (last - first)
    assert whole.idle_s >= outside
    zero = [b[0] - a[0] for a, b in pairs if a[1] == 0]
    assert whole.idle_s == pytest.approx(sum(zero) + whole.until - last)
    assert whole.utilization == pytest.approx(area / whole.duration_s / cap)


def test_an_idle_server_reports_zero_utilization():
    with MockOpenAIServer(HashBackend()) as server:
        time.sleep(0.05)
        stats = server.stats()
    assert (stats.requests, stats.peak_in_flight, stats.utilization) == (0, 0, 0.0)
    assert stats.idle_s == pytest.approx(stats.duration_s) and stats.duration_s >= 0.05
    after = server.stats()
    time.sleep(0.01)
    assert server.stats() == after  # once stopped, the default window ends at the shutdown


async def _many_connections(port: int, connections: int, per_connection: int) -> list[int]:
    data = json.dumps({"prompt": "go up", "max_tokens": 4}).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data

    async def one() -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        codes = []
        for _ in range(per_connection):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(re.search(rb"content-length: (\d+)", head).group(1))
            json.loads(await reader.readexactly(length))
            codes.append(int(head.split()[1]))
        writer.close()
        return codes

    results = await asyncio.gather(*(one() for _ in range(connections)))
    return [c for codes in results for c in codes]


def test_hundreds_of_keep_alive_connections():
    with MockOpenAIServer(HashBackend(), max_in_flight=32) as server:
        codes = asyncio.run(_many_connections(server.port, 300, 3))
        stats = server.stats()
    assert codes == [200] * 900
    assert stats.requests == 900 and stats.peak_in_flight <= 32


def test_max_lifetime_stops_the_server():
    server = MockOpenAIServer(HashBackend(), max_lifetime_s=0.5).start()
    kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    kept.request("POST", "/v1/completions", body=json.dumps({"prompt": "go"}))
    assert kept.getresponse().read()
    assert server.running
    assert server.wait(timeout=60)  # it shut itself down (60 s: a hang guard only)
    assert not server.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)
    with pytest.raises((http.client.HTTPException, ConnectionError)):  # the kept-alive one too
        kept.request("POST", "/v1/completions", body=json.dumps({"prompt": "go"}))
        kept.getresponse()
    assert server.stats().requests == 1
    server.stop()  # idempotent


def test_bad_arguments_and_busy_port():
    with pytest.raises(ValueError, match=re.escape("max_in_flight must be an int >= 1, got 0")):
        MockOpenAIServer(HashBackend(), max_in_flight=0)
    with pytest.raises(
        ValueError, match=re.escape("dialect must be 'vllm' or 'sglang', got 'tgi'")
    ):
        MockOpenAIServer(HashBackend(), dialect="tgi")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=re.escape("the server is not started")):
        _ = MockOpenAIServer(HashBackend()).base_url
    with MockOpenAIServer(HashBackend()) as first:
        with pytest.raises(OSError):
            MockOpenAIServer(HashBackend(), port=first.port).start()
        assert first.base_url == f"http://127.0.0.1:{first.port}/v1"


def test_cli_serves_until_interrupted():
    cmd = [
        sys.executable,
        "-m",
        "mock_server.mock_openai",
        "--hash",
        "--port",
        "0",
        "--max-lifetime",
        "60",
        "--latency-median",
        "0.01",
        "--latency-p99",
        "0.05",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        # Ctrl-C reaches it even where this process was started ignoring SIGINT (a background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/v1", line).group()
        status, out = call(url + "/completions", {"prompt": "go up", "seed": 1})
        assert status == 200 and out["choices"][0]["text"] == digest_answer("go up", 1)
        proc.send_signal(signal.SIGINT)  # Ctrl-C: stop, print the stats, exit 0
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "1 requests (0 errors)" in stdout and "RuntimeWarning" not in stderr


def test_cli_main_with_a_model(tiny_lm, capsys):
    from mock_server.mock_openai import main

    assert main(["--model", str(tiny_lm), "--port", "0", "--max-lifetime", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "serving 'tiny' at http://127.0.0.1:" in out and "0 requests (0 errors)" in out


def test_http_details_expect_continue_and_null_max_tokens():
    backend = HashBackend(lambda p, s: " ".join(["go"] * 30), context_length=12)
    with MockOpenAIServer(backend, dialect="sglang") as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        body = json.dumps({"prompt": "a b", "max_tokens": None})
        # curl sends "Expect: 100-continue" for larger bodies and waits for the 100 first.
        conn.request("POST", "/v1/completions", body=body, headers={"Expect": "100-continue"})
        response = conn.getresponse()
        out = json.loads(response.read())
        assert response.status == 200 and response.getheader("content-type") == "application/json"
        # SGLang's dialect: an explicit null max_tokens means "up to the context": 12 - 2.
        assert out["usage"]["completion_tokens"] == 10
        assert out["choices"][0]["finish_reason"] == "length"
        # Absent, it is 16: too many for this context (on the same kept-alive connection).
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "a b"}))
        response = conn.getresponse()
        error = json.loads(response.read())
        assert response.status == 400 and error["param"] == "max_tokens"
        assert error["message"].startswith("max_tokens=16 is too large")
        conn.close()
    # vLLM normalises an explicit null to its default 16 (normalize_null_max_tokens).
    with MockOpenAIServer(backend) as server:
        status, out = call(server.base_url + "/completions", {"prompt": "a b", "max_tokens": None})
        assert status == 400 and out["error"]["message"].startswith("max_tokens=16 is too large")
