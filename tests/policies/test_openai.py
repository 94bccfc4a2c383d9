"""The ``openai`` policy against a real OpenAI-compatible HTTP server on 127.0.0.1.

The server answers /v1/chat/completions and /v1/completions in the OpenAI format with content
derived from the request (``echo:<prompt>``), so order can be checked, records every request
(body, headers, time) and the most requests it had in flight, and injects faults per prompt:
each prompt's list of faults is consumed one attempt at a time, then it succeeds. A request that
asks for token ids (``return_token_ids``) gets vLLM's token fields (test_openai_edge.py serves
hostile ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import os
import pickle
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent_memory.policies import make_policy
from agent_memory.policies.openai_client import (
    THREAD_PREFIX,
    ClientStats,
    OpenAIPolicy,
    ServerRefused,
    ServerUnavailable,
)

# These tests are about the transport (order, retries, deadlines): text only. The token path is
# in test_openai_tokens.py and tests/serving/test_vllm.py.
#: The prompt of the policy's server check (OpenAIPolicy.check_server).
CHECK = "Hi"
#: Every sampling field at its "off" value: the policy sends each one explicitly.
NEUTRAL = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
FAST = {"backoff": (0.001, 0.005), "timeout": 5.0, "return_tokens": False}


class FakeOpenAI:
    """State of the test server: faults to inject, requests seen, concurrency observed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.faults: dict[str, list[tuple[Any, ...]]] = {}
        self.delays: dict[str, float] = {}
        self.in_flight = 0
        self.max_in_flight = 0
        self.httpd: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def bodies(self) -> list[dict[str, Any]]:
        """The bodies of the prompts' requests (not the policy's one-token server check)."""
        return [r["body"] for r in self.requests if r["key"] != CHECK]

    def attempts(self, key: str, clock: str = "time") -> list[float]:
        """When each request of ``key`` arrived: ``time.monotonic()`` (``clock="time"``) or
        ``time.time()`` (``"wall"``)."""
        return [r[clock] for r in self.requests if r["key"] == key]


def _key(body: dict[str, Any]) -> str:
    if "messages" in body:
        return str(body["messages"][-1]["content"])
    return str(body.get("prompt"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as real servers do
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server: Any

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self._done()  # before the answer leaves: its client may send its next one at once
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass

    def do_POST(self) -> None:
        state: FakeOpenAI = self.server.state
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = _key(body)
        with state.lock:
            # The one-token server check (one per event loop that sends) is not held to the
            # policy's bound: count the prompts' requests only.
            self._counted = key != CHECK
            state.in_flight += self._counted
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
            state.requests.append(
                {
                    "path": self.path,
                    "body": body,
                    "headers": dict(self.headers),
                    "key": key,
                    "time": time.monotonic(),
                    "wall": time.time(),
                    "port": self.client_address[1],  # the client's end: its connection
                }
            )
            queue = state.faults.get(key, [])
            fault = queue.pop(0) if queue else ("ok",)
        try:
            self._answer(state, body, key, fault)
        finally:
            self._done()

    def _done(self) -> None:
        """This request is no longer in flight (once)."""
        state: FakeOpenAI = self.server.state
        with state.lock:
            if getattr(self, "_counted", False):
                state.in_flight -= 1
                self._counted = False

    def _answer(self, state: FakeOpenAI, body: dict[str, Any], key: str, fault: tuple) -> None:
        kind = fault[0]
        if kind == "status":  # headers: a dict, or a function that makes it as the answer goes
            _, status, message, headers = fault
            headers = headers() if callable(headers) else headers
            self._send(status, {"error": {"message": message, "type": "test"}}, headers)
            return
        if kind == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if kind == "raw":  # ("raw", body[, headers[, status]])
            status = fault[3] if len(fault) > 3 else 200
            self._send(status, fault[1], fault[2] if len(fault) > 2 else None)
            return
        if kind == "chunked":  # ("chunked", chunks, headers): no Content-Length
            self._chunked(fault[1], fault[2])
            return
        if kind == "drip":  # headers, then the body one byte at a time (a stuck proxy)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "40")
            self.end_headers()
            try:
                for _ in range(40):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(fault[1])
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        if kind == "sleep":
            time.sleep(fault[1])
        if kind == "hold":  # ("hold", event): no answer until the test sets the event
            fault[1].wait()
        time.sleep(state.delays.get(key, 0.0))
        content = None if kind == "null" else f"echo:{key}"
        finish = "length" if kind == "length" else "stop"
        usage = {"prompt_tokens": len(key), "completion_tokens": 3, "total_tokens": len(key) + 3}
        if self.path == "/v1/chat/completions":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
            obj = "chat.completion"
        elif self.path == "/v1/completions":
            choice = {"index": 0, "text": content, "finish_reason": finish}
            obj = "text_completion"
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})
            return
        payload = {
            "id": "cmpl-test",
            "object": obj,
            "created": 0,
            "model": body.get("model"),
            "choices": [choice],
            "usage": usage,
        }
        if body.get("return_token_ids"):  # vLLM's token fields (ids of no particular model)
            logprobs = [-0.5, -0.25, 0.0]
            choice["token_ids"], payload["prompt_token_ids"] = [5, 6, 7], [1, 2]
            if obj == "chat.completion":
                entries = [{"token": "t", "logprob": lp} for lp in logprobs]
                choice["logprobs"] = {"content": entries}
            else:
                choice["logprobs"] = {"token_logprobs": logprobs, "tokens": ["t"] * 3}
        self._send(200, payload)

    def _chunked(self, chunks: Any, headers: dict[str, str]) -> None:
        """A 200 answer whose body's size shows only as it arrives (chunked encoding)."""
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self._done()
            for chunk in chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading
            self.close_connection = True


@contextlib.contextmanager
def serve() -> Iterator[FakeOpenAI]:
    """The fake server, on a free port of 127.0.0.1 while in the block."""
    state = FakeOpenAI()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.state = state  # type: ignore[attr-defined]
    state.httpd = httpd
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- happy path


def test_chat_keeps_prompt_order_and_sends_sampling_params_and_key(server, monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test-123")
    prompts = [f"prompt {i}" for i in range(12)]
    # Later prompts answer first: completion order is the reverse of prompt order.
    server.delays = {p: 0.002 * (12 - i) for i, p in enumerate(prompts)}
    with OpenAIPolicy(
        server.base_url,
        "tiny-model",
        api_key_env="TEST_LLM_KEY",
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        max_tokens=32,
        stop=["</action>"],
        seed=100,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        concurrency=4,
        **FAST,
    ) as policy:
        out = policy.act(prompts)
        again = policy.act(prompts[:2])
    assert out == [f"echo:{p}" for p in prompts]
    assert again == ["echo:prompt 0", "echo:prompt 1"]
    assert {r["path"] for r in server.requests} == {"/v1/chat/completions"}
    assert all(r["headers"]["Authorization"] == "Bearer sk-test-123" for r in server.requests)
    by_prompt = {(_key(b), b["seed"]): b for b in server.bodies()}
    body = by_prompt[("prompt 3", 103)]
    assert body == {
        "model": "tiny-model",
        **NEUTRAL,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 32,
        "stop": ["</action>"],
        "messages": [{"role": "user", "content": "prompt 3"}],
        "top_k": 20,
        "chat_template_kwargs": {"enable_thinking": False},
        "seed": 103,
    }
    # Seeds continue across calls: identical prompts never share a seed.
    assert sorted(b["seed"] for b in server.bodies()) == list(range(100, 114))
    assert policy.stats.calls == 2 and policy.stats.prompts == 14
    assert policy.stats.requests == 14 and policy.stats.retries == policy.stats.failures == 0
    assert policy.stats.prompt_tokens == sum(map(len, prompts + prompts[:2]))
    assert policy.stats.completion_tokens == 3 * 14
    assert policy.last_stats.prompts == 2 and policy.last_errors == {}
    assert policy.stats.total_latency_s > 0 and policy.stats.wall_s > 0


def test_unset_sampling_params_are_sent_off_and_messages_pass_through(server):
    messages = [
        {"role": "system", "content": "You play Sokoban."},
        {"role": "user", "content": "where next?"},
    ]
    with OpenAIPolicy(server.base_url, "m", api_key="", **FAST) as policy:
        assert policy.act([messages, "plain"]) == ["echo:where next?", "echo:plain"]
    first, second = sorted(server.bodies(), key=_key)
    # Sent, not left out: vLLM would fill a missing field from the model's generation_config.
    assert second == {"model": "m", **NEUTRAL, "messages": messages}
    assert first == {"model": "m", **NEUTRAL, "messages": [{"role": "user", "content": "plain"}]}
    assert all("Authorization" not in r["headers"] for r in server.requests)


def test_the_greedy_twin_sends_temperature_zero_and_the_policy_keeps_its_own(server):
    with OpenAIPolicy(server.base_url, "m", api_key="", **FAST) as policy:
        greedy = policy.greedy()
        try:
            greedy.act(["a"])
            policy.act(["b"])
        finally:
            greedy.close()
    sent = {b["messages"][0]["content"]: b["temperature"] for b in server.bodies()}
    assert sent == {"a": 0.0, "b": NEUTRAL["temperature"]}


def test_completion_mode_posts_prompts_and_refuses_message_lists(server):
    with OpenAIPolicy(server.base_url, "m", mode="completion", max_tokens=5, **FAST) as policy:
        assert policy.act(["a", "b"]) == ["echo:a", "echo:b"]
        with pytest.raises(
            ValueError,
            match=re.escape(
                "prompt 1 is a list but mode='completion' sends text prompts only: use "
                "mode='chat' so the server applies the model's chat template to message lists, "
                "token_in=True to apply it here, or a text formatter"
            ),
        ):
            policy.act(["fine", [{"role": "user", "content": "x"}]])
    # The server check, then the two prompts; nothing more sent.
    assert [r["path"] for r in server.requests] == ["/v1/completions"] * 3
    assert server.requests[0]["key"] == CHECK and server.requests[0]["body"]["max_tokens"] == 1
    assert sorted(server.bodies(), key=_key)[0] == {
        "model": "m",
        **NEUTRAL,
        "max_tokens": 5,
        "prompt": "a",
    }


def test_concurrency_limit_is_honoured(server):
    prompts = [f"p{i}" for i in range(9)]
    server.delays = dict.fromkeys(prompts, 0.03)
    for limit in (1, 3):
        server.max_in_flight = 0
        with OpenAIPolicy(server.base_url, "m", concurrency=limit, **FAST) as policy:
            assert policy.act(prompts) == [f"echo:{p}" for p in prompts]
        assert server.max_in_flight == limit


def test_a_workers_share_of_the_concurrency_can_move(server):
    """A worker's copy starts at its share and the driver moves it (up to the policy's
    concurrency): the requests in flight follow, raised while requests wait for a slot."""
    prompts = [f"p{i}" for i in range(12)]
    server.delays = dict.fromkeys(prompts, 0.05)
    with OpenAIPolicy(server.base_url, "m", concurrency=4, **FAST).for_workers(2) as policy:
        assert (policy.concurrency, policy.max_concurrency) == (2, 4)
        assert policy.act(prompts[:6]) == [f"echo:{p}" for p in prompts[:6]]
        assert server.max_in_flight == 2
        server.max_in_flight = 0
        policy.set_concurrency(4)
        assert policy.act(prompts) == [f"echo:{p}" for p in prompts]
        assert server.max_in_flight == 4
        server.max_in_flight = 0
        policy.set_concurrency(1)
        assert policy.act(prompts[:4]) == [f"echo:{p}" for p in prompts[:4]]
        assert server.max_in_flight == 1

        waiting: list[list[str]] = []  # raised while a call's requests wait for their slot
        server.max_in_flight = 0
        caller = threading.Thread(target=lambda: waiting.append(policy.act(prompts[:6])))
        caller.start()
        time.sleep(0.08)
        policy.set_concurrency(3)
        caller.join(10)
        assert waiting == [[f"echo:{p}" for p in prompts[:6]]] and server.max_in_flight == 3


def test_prepare_opens_the_client_and_checks_the_server_once(server):
    before = len(_request_threads())
    policy = OpenAIPolicy(server.base_url, "m", **FAST)
    policy.prepare()  # what a rollout worker does at start-up
    policy.prepare()  # once is enough: the same client, no second check
    # A synchronous caller's requests run on the policy's one private loop thread.
    assert [r["key"] for r in server.requests] == [CHECK]
    assert len(_request_threads()) == before + 1
    assert policy.act(["a"]) == ["echo:a"]
    policy.close()
    with pytest.raises(RuntimeError, match="is closed"):
        policy.prepare()


def test_set_concurrency_out_of_range_names_the_limit():
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", "m", concurrency=8).for_workers(2)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "concurrency must be at most max_concurrency=8 (the policy's connections), got 9"
        ),
    ):
        policy.set_concurrency(9)
    with pytest.raises(ValueError, match=re.escape("concurrency must be an int >= 1, got 0")):
        policy.set_concurrency(0)
    assert policy.concurrency == 4


def test_closing_releases_requests_waiting_for_a_slot(server):
    prompts = ["p0", "p1"]
    server.delays = dict.fromkeys(prompts, 0.3)
    # Two threads, one slot: p1's thread waits for p0's slot when the policy closes.
    policy = OpenAIPolicy(
        server.base_url, "m", concurrency=2, max_retries=0, timeout=5.0, return_tokens=False
    )
    policy = policy.for_workers(2)
    policy.prepare()  # the server check is done: only the prompts' requests are in play
    out: list[list[str]] = []
    caller = threading.Thread(target=lambda: out.append(policy.act(prompts)))
    caller.start()
    deadline = time.monotonic() + 10
    while not any(r["key"] == "p0" for r in server.requests) and time.monotonic() < deadline:
        time.sleep(0.005)  # until p0 holds the one slot (the server has it)
    policy.close()
    caller.join(10)
    assert not caller.is_alive() and out and out[0][1] == ""
    assert policy.stats.requests == 1  # p1 was never sent
    assert "RuntimeError: the policy was closed" in policy.last_errors[1]


def test_concurrent_callers_share_the_limit(server):
    prompts = [f"p{i}" for i in range(6)]
    server.delays = dict.fromkeys(prompts, 0.03)
    results: dict[int, list[str]] = {}
    with OpenAIPolicy(server.base_url, "m", concurrency=2, **FAST) as policy:
        callers = [
            threading.Thread(target=lambda k=k: results.update({k: policy.act(prompts)}))
            for k in range(3)
        ]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
    assert results == {k: [f"echo:{p}" for p in prompts] for k in range(3)}
    assert server.max_in_flight == 2 and policy.stats.calls == 3 and policy.stats.requests == 18


def test_null_content_fails_its_request_and_a_length_finish_is_counted(server):
    # A null content is no text (a tool call's, a refusal's): its request's failure, not "".
    server.faults = {"a": [("null",)], "b": [("length",)]}
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        a, b = policy.generate(["a", "b"])
    assert (a.text, a.finish_reason, b.text, b.finish_reason) == ("", "error", "echo:b", "length")
    assert policy.stats.failures == policy.stats.non_text_answers == 1
    assert policy.stats.truncated == 1 and len(server.attempts("a")) == 1  # not retried
    assert policy.last_errors[0].startswith(
        "non-text response (choices[0].message.content is null: expected text): '{"
    )


# ---------------------------------------------------------------------- faults


def test_500_then_success_is_retried(server):
    server.faults = {"x": [("status", 500, "boom", {}), ("status", 502, "bad gateway", {})]}
    with OpenAIPolicy(server.base_url, "m", max_retries=3, **FAST) as policy:
        assert policy.act(["x", "y"]) == ["echo:x", "echo:y"]
    assert len(server.attempts("x")) == 3
    assert policy.stats.requests == 4 and policy.stats.retries == 2
    assert policy.stats.failures == 0 and policy.last_errors == {}


def test_429_and_503_honour_retry_after(server):
    server.faults = {
        "x": [("status", 429, "slow down", {"Retry-After": "1"})],
        "y": [("status", 503, "loading", {"Retry-After": "0.3"})],
    }
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        assert policy.act(["x", "y"]) == ["echo:x", "echo:y"]
    x, y = server.attempts("x"), server.attempts("y")
    assert len(x) == len(y) == 2
    assert x[1] - x[0] >= 1.0  # the backoff alone would wait at most 5 ms
    assert y[1] - y[0] >= 0.3
    assert policy.stats.retries == 2


def test_the_server_check_waits_the_retry_after_seconds_of_a_429(server):
    server.faults = {CHECK: [("status", 429, "slow down", {"Retry-After": "1"})]}
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        policy.prepare()  # what a rollout worker does at start-up
        assert policy.act(["x"]) == ["echo:x"]
    first, second = server.attempts(CHECK)  # the check retried once, and nothing more
    assert second - first >= 1.0  # the backoff alone would wait at most 5 ms
    assert policy.stats.requests == 1  # (the check is not a prompt's request)


def test_the_server_check_waits_until_the_retry_after_date_of_a_429(server):
    dates = []

    def retry_after() -> dict[str, str]:  # made as the 429 goes: 1 to 2 s after the attempt
        dates.append(math.ceil(time.time()) + 2)  # an HTTP date has whole seconds
        return {"Retry-After": email.utils.formatdate(dates[-1], usegmt=True)}

    server.faults = {CHECK: [("status", 429, "slow down", retry_after)]}
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        policy.prepare()
        assert policy.act(["x"]) == ["echo:x"]
    first, second = server.attempts(CHECK, clock="wall")
    (date,) = dates
    assert first < date <= second + 0.01  # (0.01: the two clocks' reading of one instant)


def test_a_retry_after_past_the_checks_deadline_defers_the_next_check(server):
    # 30 s is past the check's own deadline (timeout=5): it gives up at once, and no call
    # sends the check again before the 30 s are over; the prompts' requests go meanwhile.
    server.faults = {CHECK: [("status", 429, "slow down", {"Retry-After": "30"})]}
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        policy.prepare()
        assert policy.act(["x"]) == ["echo:x"]
        assert policy.act(["y"]) == ["echo:y"]
    assert len(server.attempts(CHECK)) == 1


def test_the_server_check_gives_up_after_max_retries(server):
    server.faults = {CHECK: [("status", 503, "loading", {"Retry-After": "0.2"})] * 2}
    with OpenAIPolicy(server.base_url, "m", **FAST | {"max_retries": 1}) as policy:
        policy.prepare()  # two attempts, 0.2 s apart, then the check waits for a later call
        assert len(server.attempts(CHECK)) == 2
        time.sleep(0.2)
        assert policy.act(["x"]) == ["echo:x"]  # checked again (answered), then sent
    checks = server.attempts(CHECK)
    assert len(checks) == 3 and checks[1] - checks[0] >= 0.2 and checks[2] - checks[1] >= 0.2


def test_retry_after_is_capped(server, caplog):
    server.faults = {"x": [("status", 429, "come back tomorrow", {"Retry-After": "86400"})]}
    with (
        caplog.at_level(logging.DEBUG, logger="agent_memory.policies.openai_client"),
        OpenAIPolicy(server.base_url, "m", max_retry_after=0.05, **FAST) as policy,
    ):
        assert policy.act(["x"]) == ["echo:x"]
    # The wait it chose, logged before it sleeps: the cap, not the day the server asked for.
    assert "prompt 0: HTTP 429: come back tomorrow; retry in 0.05 s" in caplog.text
    x = server.attempts("x")
    assert len(x) == 2 and x[1] - x[0] >= 0.05 and policy.stats.retries == 1


def test_slow_response_times_out_and_is_retried(server, caplog):
    server.faults = {"slow": [("sleep", 1.5)]}
    with (
        caplog.at_level(logging.DEBUG, logger="agent_memory.policies.openai_client"),
        OpenAIPolicy(
            server.base_url,
            "m",
            timeout=0.2,
            max_retries=2,
            backoff=(0.001, 0.005),
            return_tokens=False,
        ) as policy,
    ):
        assert policy.act(["slow"]) == ["echo:slow"]
    # It did not wait for the slow answer: the first attempt was abandoned at its deadline and
    # the answer is the retry's (a client that waited would have sent one request, no retry).
    assert "prompt 0: timed out after 0.2 s; retry in" in caplog.text
    assert len(server.attempts("slow")) == 2 and policy.stats.retries == 1
    assert policy.stats.failures == 0 and policy.last_errors == {}


def test_always_slow_gives_empty_response_and_a_recorded_timeout(server):
    server.faults = {"slow": [("sleep", 1.0)] * 2}
    with OpenAIPolicy(
        server.base_url,
        "m",
        timeout=0.1,
        max_retries=1,
        backoff=(0.001, 0.005),
        return_tokens=False,
    ) as policy:
        out = policy.act(["ok", "slow"])
    assert out == ["echo:ok", ""]
    assert policy.last_errors == {1: "timed out after 0.1 s (after 1 retries)"}
    assert policy.stats.failures == 1 and policy.stats.requests == 3


def test_400_is_not_retried_and_reports_the_server_message(server, caplog):
    server.faults = {"bad": [("status", 400, "max_tokens must be at least 1, got -5", {})]}
    with (
        caplog.at_level(logging.WARNING, logger="agent_memory.policies.openai_client"),
        OpenAIPolicy(server.base_url, "m", api_key="sk-secret-999", max_retries=5, **FAST) as p,
    ):
        out = p.act(["good", "bad", "good too"])
    assert out == ["echo:good", "", "echo:good too"]
    assert len(server.attempts("bad")) == 1
    assert p.last_errors == {1: "HTTP 400: max_tokens must be at least 1, got -5"}
    assert p.stats.failures == 1 and p.stats.retries == 0
    assert "1 of 3 prompts failed" in caplog.text
    assert "HTTP 400: max_tokens must be at least 1" in caplog.text
    assert "sk-secret-999" not in caplog.text and "sk-secret-999" not in repr(p)


def test_retries_exhausted_gives_empty_response(server):
    server.faults = {"x": [("status", 500, "still broken", {})] * 10}
    with OpenAIPolicy(server.base_url, "m", max_retries=2, **FAST) as policy:
        assert policy.act(["x"]) == [""]
    assert len(server.attempts("x")) == 3
    assert policy.last_errors == {0: "HTTP 500: still broken (after 2 retries)"}


def test_dropped_connection_is_retried(server):
    server.faults = {"x": [("drop",)]}
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        assert policy.act(["x"]) == ["echo:x"]
    assert policy.stats.retries == 1


def test_malformed_200_is_a_failure_not_retried(server):
    server.faults = {"x": [("raw", b"<html>proxy error</html>")]}
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        assert policy.act(["x"]) == [""]
    assert policy.stats.requests == 1
    assert policy.last_errors[0] == (
        f"malformed response from {server.base_url}/chat/completions (not JSON: JSONDecodeError: "
        "Expecting value: line 1 column 1 (char 0)): '<html>proxy error</html>'"
    )


def test_a_server_that_never_answers_fails_after_dead_calls():
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with OpenAIPolicy(url, "m", max_retries=2, dead_calls=2, **FAST) as policy:
        assert policy.act(["a", "b", "c"]) == ["", "", ""]  # the first call: the invalid path
        assert policy.stats.failures == 3 and policy.stats.requests == 9
        assert set(policy.last_errors) == {0, 1, 2}
        assert all(e.startswith("ConnectError") for e in policy.last_errors.values())
        with pytest.raises(
            ServerUnavailable,
            match=re.escape(
                f"the server at {url}/chat/completions never answered: every request of the "
                "first 2 calls failed without an HTTP response (last: ConnectError: [Errno 111] "
                f"Connection refused (after 2 retries)). Is it running? Check "
                f"policy.params.base_url={url!r}"
            ),
        ):
            policy.act(["a"])


def test_a_server_that_answered_once_never_fails_the_run(server):
    with OpenAIPolicy(server.base_url, "m", max_retries=0, dead_calls=1, **FAST) as policy:
        assert policy.act(["a"]) == ["echo:a"]
        server.faults = {"b": [("drop",)] * 3}
        for _ in range(3):  # the connection drops every time: still only the invalid path
            assert policy.act(["b"]) == [""]
        server.faults = {"c": [("status", 503, "loading", {})]}
        assert policy.act(["c"]) == [""]  # an HTTP error is an answer


def test_dead_calls_zero_never_raises():
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with OpenAIPolicy(url, "m", max_retries=0, dead_calls=0, **FAST) as policy:
        for _ in range(3):
            assert policy.act(["a"]) == [""]


def test_a_drip_fed_answer_cannot_outlive_the_total_timeout(server):
    server.faults = {"drip": [("drip", 0.3)] * 2}
    with OpenAIPolicy(
        server.base_url, "m", timeout=1.0, max_retries=0, return_tokens=False
    ) as policy:
        assert policy.act(["drip"]) == [""]
    # The total deadline fired: per phase, each 0.3 s byte would have kept the request alive
    # until the 40 bytes were in (~12 s), and it would have failed as "malformed response
    # (not JSON)" instead; no retry was sent.
    assert policy.last_errors == {0: "timed out after 1 s"}
    assert len(server.attempts("drip")) == 1 and policy.stats.failures == 1


# ---------------------------------------------------------------------- lifecycle


def _request_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def test_close_releases_the_threads_and_connections(server):
    before = len(_request_threads())
    policy = OpenAIPolicy(server.base_url, "m", **FAST)
    assert len(_request_threads()) == before  # nothing starts before the first call
    assert policy.act(["a", "b", "c"]) == ["echo:a", "echo:b", "echo:c"]
    (client,) = [c.transport for c in policy._runtime.loops.values()]  # the private loop's
    assert len(_request_threads()) == before + 1
    policy.close()
    policy.close()  # idempotent
    assert client.is_closed and len(_request_threads()) == before
    with pytest.raises(RuntimeError, match="is closed"):
        policy.act(["a"])
    assert policy.act([]) == []


def test_a_dropped_policy_stops_its_thread(server):
    import gc

    before = len(_request_threads())
    policy = OpenAIPolicy(server.base_url, "m", **FAST)
    policy.act(["a"])
    del policy
    gc.collect()
    assert len(_request_threads()) == before


def test_pickled_policy_starts_its_own_client(server):
    with OpenAIPolicy(server.base_url, "m", seed=7, **FAST) as policy:
        policy.act(["a"])
        with pickle.loads(pickle.dumps(policy)) as copy:
            assert copy.act(["b"]) == ["echo:b"]
    assert [b["seed"] for b in server.bodies()] == [7, 8]


def test_async_callers(server):
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        out = asyncio.run(policy.aact(["a", "b"]))
        assert not policy._runtime.loops  # the loop closed its client when it shut down
    assert out == ["echo:a", "echo:b"]


# ---------------------------------------------------------------------- asyncio


def test_agenerate_starts_no_thread_per_request():
    """The worker's case: one single-prompt call per env, all at once, on its event loop."""
    from mock_server import HashBackend, MockOpenAIServer

    async def burst(policy: OpenAIPolicy) -> tuple[set[str], list[str]]:
        await policy.agenerate(["warm"])  # the loop's client, the server check
        # Threads that exist now may end meanwhile (an earlier test's): count only new ones.
        before, started = {t.ident for t in threading.enumerate()}, set()

        async def one(k: int) -> str:
            (g,) = await policy.agenerate([f"p{k}"])
            started.update(t.name for t in threading.enumerate() if t.ident not in before)
            return g.text

        texts = await asyncio.gather(*(one(k) for k in range(64)))
        return started, list(texts)

    backend = HashBackend(lambda prompt, seed: "go up")
    with (
        MockOpenAIServer(backend, max_in_flight=64) as server,
        OpenAIPolicy(server.base_url, "hash", concurrency=64, **FAST) as policy,
    ):
        private = len(_request_threads())
        started, texts = asyncio.run(burst(policy))
        assert len(_request_threads()) == private  # nor the sync callers' loop thread
    assert texts == ["go up"] * 64 and started == set()
    assert policy.stats.requests == 65 and policy.stats.failures == 0


def test_the_in_flight_bound_holds_under_agenerate(server):
    prompts, later = [f"p{i}" for i in range(12)], [f"q{i}" for i in range(10)]
    server.delays = {**dict.fromkeys(prompts, 0.03), **dict.fromkeys(later, 0.2)}

    async def calls(policy: OpenAIPolicy) -> tuple[list[str], int, list[str]]:
        first = await asyncio.gather(*(policy.aact([p]) for p in prompts))
        peak, server.max_in_flight = server.max_in_flight, 0
        waiting = asyncio.gather(*(policy.aact([p]) for p in later))
        await asyncio.sleep(0.05)
        policy.set_concurrency(5)  # raised while calls wait for a slot
        return [t for (t,) in first], peak, [t for (t,) in await waiting]

    with OpenAIPolicy(server.base_url, "m", concurrency=6, **FAST).for_workers(2) as policy:
        first, peak, second = asyncio.run(calls(policy))
    assert first == [f"echo:{p}" for p in prompts] and peak == 3
    assert second == [f"echo:{p}" for p in later] and server.max_in_flight == 5


def test_sync_and_async_callers_share_the_bound(server):
    prompts = [f"p{i}" for i in range(8)]
    server.delays = dict.fromkeys(prompts, 0.03)

    async def both(policy: OpenAIPolicy) -> tuple[list[str], list[list[str]]]:
        sync = asyncio.to_thread(policy.act, prompts)  # on the private loop, from a thread
        return await asyncio.gather(sync, asyncio.gather(*(policy.aact([p]) for p in prompts)))

    with OpenAIPolicy(server.base_url, "m", concurrency=2, **FAST) as policy:
        texts, answers = asyncio.run(both(policy))
        assert policy.act(["a"]) == ["echo:a"]  # and from a running loop's own thread:
        assert asyncio.run(asyncio.to_thread(lambda: policy.act(["b"]))) == ["echo:b"]

        async def inside() -> list[str]:
            return policy.act(["c"])  # blocks this loop, not the policy's

        assert asyncio.run(inside()) == ["echo:c"]
    assert texts == [f"echo:{p}" for p in prompts] and answers == [[t] for t in texts]
    assert server.max_in_flight == 2


def test_closing_ends_agenerate_calls_in_flight_and_waiting(server):
    held = threading.Event()  # the server answers neither prompt until the test is over
    server.faults = {"p0": [("hold", held)], "p1": [("hold", held)]}
    policy = OpenAIPolicy(
        server.base_url, "m", concurrency=2, max_retries=0, timeout=8.0, return_tokens=False
    ).for_workers(2)  # one slot

    async def one(prompt: str) -> tuple[list[str], dict[int, str]]:
        texts = await policy.aact([prompt])
        return texts, dict(policy.last_errors)  # this call's errors (no await in between)

    async def main() -> list[tuple[list[str], dict[int, str]]]:
        await policy.aact(["warm"])
        calls = asyncio.gather(one("p0"), one("p1"))
        while not server.attempts("p0"):
            await asyncio.sleep(0.005)
        policy.close()  # from the loop's own thread, p0 in flight, p1 waiting for the slot
        return list(await calls)

    try:
        outcomes = asyncio.run(main())
    finally:
        held.set()
    # Ended by the close, not by an answer (held back) nor by the 8 s timeout (another error).
    closed = {0: "RuntimeError: the policy was closed"}
    assert outcomes == [([""], closed), ([""], closed)]
    assert policy.stats.requests == 2 and policy.stats.failures == 2  # p1 was never sent
    assert server.attempts("p1") == []


def test_a_cancelled_agenerate_gives_its_slot_back(server):
    server.delays = {"slow": 5.0}

    async def main(policy: OpenAIPolicy) -> list[str]:
        slow = asyncio.ensure_future(policy.aact(["slow"]))
        queued = asyncio.ensure_future(policy.aact(["queued"]))
        while not server.attempts("slow"):
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)  # "queued" waits for the one slot
        for task in (queued, slow):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return await policy.aact(["after"])

    with OpenAIPolicy(server.base_url, "m", concurrency=1, **FAST) as policy:
        assert asyncio.run(main(policy)) == ["echo:after"]
    assert [r["key"] for r in server.requests] == [CHECK, "slow", "after"]


def test_an_interrupted_sync_caller_leaves_no_requests_queued(server):
    prompts = [f"p{i}" for i in range(6)]
    server.delays = dict.fromkeys(prompts, 0.3)
    with OpenAIPolicy(server.base_url, "m", concurrency=1, **FAST) as policy:
        policy.prepare()
        timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
        # Ctrl-C's own handler, whatever was inherited (a background job ignores SIGINT)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                policy.act(prompts)
            timer.join()
        finally:
            signal.signal(signal.SIGINT, previous)
        assert policy.act(["after"]) == ["echo:after"]  # the interrupted one's slot is free
    assert [r["key"] for r in server.requests] == [CHECK, "p0", "after"]


def test_registered_as_openai(server):
    with make_policy("openai", base_url=server.base_url, model="m", **FAST) as policy:
        assert isinstance(policy, OpenAIPolicy)
        assert policy.act(["hi"]) == ["echo:hi"]


def test_stats_add_up():
    a, b = ClientStats(calls=1, requests=2), ClientStats(calls=1, requests=3, failures=1)
    a.add(b)
    assert a.as_dict()["requests"] == 5 and a.calls == 2 and a.failures == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"base_url": "localhost:8000"},
            "base_url must be an http(s) URL like 'http://localhost:8000/v1', got 'localhost:8000'",
        ),
        (
            {"base_url": "http:///v1"},  # no host
            "base_url must be an http(s) URL like 'http://localhost:8000/v1', got 'http:///v1'",
        ),
        ({"model": ""}, "model must be a non-empty model name, got ''"),
        (
            {"mode": "chat_completion"},
            "mode must be one of ['chat', 'completion'], got 'chat_completion'",
        ),
        ({"concurrency": 0}, "concurrency must be an int >= 1, got 0"),
        ({"max_retries": -1}, "max_retries must be an int >= 0, got -1"),
        ({"timeout": 0}, "timeout must be a number of seconds > 0, got 0"),
        ({"temperature": -0.5}, "temperature must be a number >= 0 or None, got -0.5"),
        ({"top_p": 1.5}, "top_p must be in (0, 1] or None, got 1.5"),
        ({"backoff": (2.0, 1.0)}, "backoff must satisfy 0 <= base <= max, got (2.0, 1.0)"),
        ({"backoff": (1.0,)}, "backoff must be two numbers (base, max) in seconds, got (1.0,)"),
        ({"stop": [""]}, "stop must be a non-empty string or a list of them, got ['']"),
        ({"top_k": -2}, "top_k must be None or an int >= -1, got -2"),
        ({"min_p": 1.5}, "min_p must be in [0, 1] or None, got 1.5"),
        ({"repetition_penalty": 0}, "repetition_penalty must be a number > 0 or None, got 0"),
        ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2] or None, got 3"),
        (
            {"stop": "</action>"},
            "stop=['</action>'] with return_tokens=True needs a tokenizer: a server cuts the "
            "text before a stop string but returns the ids of the whole token holding it",
        ),
        (
            {"server": "openai"},
            "server='openai' (the plain OpenAI API) takes no return_tokens=True: it returns no "
            "token ids and knows no top_k, min_p or repetition_penalty. Pass return_tokens=False "
            "for text only, or server='vllm' / 'sglang'",
        ),
        (
            {"server": "openai", "return_tokens": False, "top_k": 5},
            "server='openai' (the plain OpenAI API) takes no top_k:",
        ),
    ],
)
def test_bad_settings_are_refused(kwargs, message):
    args = {"base_url": "http://127.0.0.1:1/v1", "model": "m", **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        OpenAIPolicy(**args)


def test_hydra_containers_are_accepted(server):
    from omegaconf import OmegaConf

    params = OmegaConf.create(
        {
            "extra_body": {"chat_template_kwargs": {"enable_thinking": False}, "priority": 5},
            "backoff": [0.001, 0.002],
            "stop": ["</action>"],
            "return_tokens": False,
        }
    )
    with OpenAIPolicy(server.base_url, "m", **params) as policy:
        assert policy.act(["x"]) == ["echo:x"]
    body = server.bodies()[0]
    assert body["chat_template_kwargs"] == {"enable_thinking": False} and body["stop"] == [
        "</action>"
    ]


def test_bad_prompts_are_refused_before_sending(server):
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        with pytest.raises(
            ValueError,
            match=re.escape("prompt 0, message 0: expected a dict with 'role' and 'content'"),
        ):
            policy.act([[{"content": "no role"}]])
        with pytest.raises(
            TypeError, match=re.escape("generate takes a sequence of prompts, got a single str")
        ):
            policy.act("not a list")
    assert server.requests == []


def test_a_server_refusing_a_field_fails_at_the_first_request(server):
    # transformers serve answers 4xx to return_token_ids: before, every prompt became an error
    # turn and the run ended "ok".
    message = "Unrecognized request argument supplied: return_token_ids"
    server.faults = {CHECK: [("status", 400, message, {})]}
    with (
        OpenAIPolicy(server.base_url, "m", **{**FAST, "return_tokens": True}) as policy,
        pytest.raises(ServerRefused) as info,
    ):
        policy.act(["a", "b"])
    assert str(info.value) == (
        f"the server at {server.base_url}/chat/completions refused the policy's request: HTTP "
        f"400: {message}. If it refuses a sampling field (top_k, min_p, repetition_penalty: vLLM "
        "and SGLang take them), pass policy.params.server=openai; if it refuses the token fields "
        "(return_token_ids, logprobs), pass policy.params.return_tokens=false (rows then hold no "
        "token ids or log-probs)"
    )
    assert server.bodies() == []  # no prompt was sent


def test_a_server_check_without_an_answer_is_tried_again(server):
    server.faults = {CHECK: [("status", 503, "loading", {})]}
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        assert policy.act(["a"]) == ["echo:a"]
        assert policy.act(["b"]) == ["echo:b"]
    assert [r["key"] for r in server.requests if r["key"] == CHECK] == [CHECK, CHECK]


def test_the_plain_openai_api_gets_only_its_own_fields(server):
    with OpenAIPolicy(server.base_url, "m", server="openai", **FAST) as policy:
        assert policy.act(["a"]) == ["echo:a"]
    assert server.bodies() == [
        {
            "model": "m",
            "temperature": 1.0,
            "top_p": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "messages": [{"role": "user", "content": "a"}],
        }
    ]
