"""The openai policy's HTTP client (``policies/openai_transport.py``): the headers a request
carries (checked once, when the policy is made), the URL parsed once, and the :class:`Reply` the
policy reads. The answers' framing, caps and encodings are tested through the policy in
test_openai_edge.py."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from agent_memory.policies.openai_client import OpenAIPolicy
from agent_memory.policies.openai_runtime import merged_headers
from agent_memory.policies.openai_transport import Reply, Target, Transport
from tests.policies.test_openai import FAST


def test_a_header_that_cannot_be_sent_fails_when_the_policy_is_made():
    message = (
        "policy.params.headers: 'X-Trace': expected a header value without CR, LF or NUL, "
        "got 'a\\r\\nInjected: 1'"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        OpenAIPolicy("http://127.0.0.1:9/v1", "m", headers={"X-Trace": "a\r\nInjected: 1"})
    message = (
        "policy.params.headers: 'X Trace': expected an ASCII token as its name and a Latin-1 "
        "value, got '1'"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        OpenAIPolicy("http://127.0.0.1:9/v1", "m", headers={"X Trace": "1"})


def test_the_users_headers_replace_the_defaults_whatever_their_case():
    assert merged_headers({}) == [
        (b"Accept", b"application/json"),
        (b"Content-Type", b"application/json"),
        (b"User-Agent", b"agent-memory"),
    ]
    assert merged_headers({"user-agent": "me/1", "X-Trace": "7"}) == [
        (b"Accept", b"application/json"),
        (b"Content-Type", b"application/json"),
        (b"user-agent", b"me/1"),
        (b"X-Trace", b"7"),
    ]


def test_requests_carry_the_defaults_the_users_headers_and_their_framing(server):
    with OpenAIPolicy(server.base_url, "m", headers={"X-Trace": "7"}, **FAST) as policy:
        assert policy.act(["a"]) == ["echo:a"]
    headers = server.requests[-1]["headers"]
    assert headers["X-Trace"] == "7" and headers["User-Agent"] == "agent-memory"
    assert headers["Content-Type"] == "application/json"
    assert headers["Host"] == server.base_url.split("/")[2]
    assert int(headers["Content-Length"]) > 0 and headers["Accept-Encoding"] == "gzip, deflate"


def test_a_target_is_an_http_url():
    t = Target("https://api.example.com/v1/completions")
    assert t.origin == (b"https", b"api.example.com", 443)
    assert (t.path, t.host) == (b"/v1/completions", b"api.example.com")
    with pytest.raises(ValueError, match=re.escape("expected an http:// or https:// URL, got")):
        Target("api.example.com/v1")


def test_a_reply_decodes_its_text_by_its_declared_charset():
    body = "café".encode("latin-1")
    assert Reply(200, "OK", {"content-type": "text/plain; charset=latin-1"}, body).text == "café"
    assert Reply(200, "OK", {}, "café".encode()).text == "café"  # UTF-8 by default
    unknown = Reply(200, "OK", {"content-type": "text/plain; charset=x-nope"}, b"ok\xff")
    assert unknown.text == "ok\ufffd"
    with pytest.raises(ValueError):
        Reply(200, "OK", {}, b"not json").json()


def test_a_closed_transport_sends_nothing():
    async def closed() -> None:
        transport = Transport()
        await transport.aclose()
        await transport.request(Target("http://127.0.0.1:9/v1/models"), b"GET", [], b"")

    with pytest.raises(RuntimeError, match="the client has been closed"):
        asyncio.run(closed())


def test_connections_are_kept_and_reused(server):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]}).encode()

    async def twice() -> tuple[list[Reply], int]:
        transport = Transport(keep=4)
        target = Target(f"{server.base_url}/chat/completions")
        try:
            replies = [await transport.request(target, b"POST", merged_headers({}), body)]
            replies.append(await transport.request(target, b"POST", merged_headers({}), body))
            return replies, len(transport.open)
        finally:
            await transport.aclose()

    replies, connections = asyncio.run(twice())
    assert connections == 1  # the second request went on the first one's connection
    for reply in replies:
        assert reply.status_code == 200 and reply.reason_phrase == "OK"
        assert reply.json()["choices"][0]["message"]["content"] == "echo:a"
        assert reply.headers["content-type"].startswith("application/json")


def test_a_request_that_asks_to_close_its_connection_does_not_keep_it(server):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]}).encode()

    async def once(headers: dict[str, str]) -> tuple[int, int]:
        transport = Transport(keep=4)
        target = Target(f"{server.base_url}/chat/completions")
        try:
            reply = await transport.request(target, b"POST", merged_headers(headers), body)
            return reply.status_code, len(transport.open)
        finally:
            await transport.aclose()

    assert asyncio.run(once({})) == (200, 1)
    assert asyncio.run(once({"Connection": "close"})) == (200, 0)


def test_an_answer_with_both_transfer_encoding_and_content_length_closes_its_connection(server):
    # RFC 9112, section 6.3: a message with both is an error (a smuggling or splitting attempt):
    # refused, its connection closed, never reused for the next request.
    answer = json.dumps({"choices": [{"message": {"content": "chunked"}}]}).encode()
    server.faults = {"a": [("chunked", [answer], {"Content-Length": str(len(answer))})]}
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "a"}]}).encode()

    async def twice() -> tuple[str, int, Reply]:
        transport = Transport(keep=4)
        target = Target(f"{server.base_url}/chat/completions")
        try:
            with pytest.raises(httpx.RemoteProtocolError) as refused:
                await transport.request(target, b"POST", merged_headers({}), body)
            left = len(transport.open)
            return (
                str(refused.value),
                left,
                await transport.request(target, b"POST", merged_headers({}), body),
            )
        finally:
            await transport.aclose()

    error, left, reply = asyncio.run(twice())
    assert error == (
        "the answer has both Transfer-Encoding and Content-Length: expected one of them "
        "(RFC 9112, section 6.3: such a message is an error)"
    )
    assert left == 0 and reply.json()["choices"][0]["message"]["content"] == "echo:a"
    first, second = (r["port"] for r in server.requests)
    assert first != second  # the next request went on a new connection


def test_a_policy_retries_an_answer_with_both_framings_on_a_new_connection(server):
    answer = json.dumps({"choices": [{"message": {"content": "chunked"}}]}).encode()
    server.faults = {"x": [("chunked", [answer], {"Content-Length": str(len(answer))})]}
    with OpenAIPolicy(server.base_url, "m", **FAST) as policy:
        assert policy.act(["x"]) == ["echo:x"]  # not the chunked body: the retry's answer
    first, second = (r["port"] for r in server.requests if r["key"] == "x")
    assert first != second and policy.stats.retries == 1
