"""The gateway against the house's mock vLLM (``scripts/mock_server``): calls pass through and
are recorded exactly, limits and refusals are named errors, records survive restarts and
torn writes, and sessions export as a rollout's rows with declared segments and flagged breaks.
The real vLLM's turn: test_vllm_gateway.py."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import urllib.request
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest
from mock_server import FixedLatency, HashBackend, MockOpenAIServer

from agent_memory.gateway.export import export_sessions
from agent_memory.gateway.records import SessionStore
from agent_memory.gateway.settings import GatewaySettings
from agent_memory.rollout.driver.writer import EPISODE_COLUMNS, ROW_COLUMNS, row_schema
from tests.gateway.helpers import export, gateway_process, running, sse, without_timing

USER = [{"role": "user", "content": "Where is the box?"}]


def _answer(prompt: str, seed: int | None) -> str:
    return f"go {'up' if 'box' in prompt else 'left'} {seed}"


@pytest.fixture(scope="module")
def upstream():
    with MockOpenAIServer(HashBackend(_answer), max_in_flight=8) as server:
        yield server


@pytest.fixture()
def gateway(upstream, tmp_path):
    with running(GatewaySettings(upstream.base_url, str(tmp_path / "sessions"), port=0)) as gw:
        yield gw


def _client(gateway, session: str, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/s/{session}/v1", api_key="none", **kwargs)


def _events(gateway, session: str) -> list[dict]:
    path = Path(gateway.settings.session_dir) / f"{session}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_call_passes_through_and_its_tokens_are_recorded_exactly(upstream, gateway):
    answer = _client(gateway, "ep-1").chat.completions.create(
        model="hash", messages=USER, max_tokens=8, seed=5
    )
    # The agent gets a normal answer: none of the log-probs or ids the gateway asked for.
    choice = answer.choices[0]
    assert choice.message.content == "go up 5"
    assert choice.logprobs is None
    assert "token_ids" not in choice.model_extra and "prompt_token_ids" not in answer.model_extra
    # The record holds what the upstream answers the same request with every field explicit.
    direct = openai.OpenAI(base_url=upstream.base_url, api_key="none").chat.completions.create(
        model="hash",
        messages=USER,
        max_tokens=8,
        seed=5,
        temperature=1.0,
        top_p=1.0,
        logprobs=True,
        extra_body={"return_token_ids": True, "top_k": -1, "min_p": 0.0},
    )
    (call,) = _events(gateway, "ep-1")
    assert call["prompt_ids"] == direct.model_extra["prompt_token_ids"]
    assert call["response_ids"] == direct.choices[0].model_extra["token_ids"]
    assert call["response_logprobs"] == [t.logprob for t in direct.choices[0].logprobs.content]
    assert call["text"] == "go up 5" and call["finish_reason"] == "stop"
    # Every sampling field is explicit: the upstream's generation config fills none of them.
    assert call["sampling"] == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_tokens": 8,
        "seed": 5,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "tools": None,  # the request offered none (else their JSON, as sent)
        "tool_choice": None,
    }


def test_an_agent_that_asks_for_logprobs_and_ids_gets_them(gateway):
    answer = _client(gateway, "ep-2").chat.completions.create(
        model="hash",
        messages=USER,
        max_tokens=8,
        seed=1,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    (call,) = _events(gateway, "ep-2")
    assert answer.choices[0].model_extra["token_ids"] == call["response_ids"]
    assert [t.logprob for t in answer.choices[0].logprobs.content] == call["response_logprobs"]


def test_a_stream_carries_the_same_answer_as_events(gateway):
    stream = _client(gateway, "ep-3").chat.completions.create(
        model="hash",
        messages=USER,
        max_tokens=8,
        seed=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "go up 2"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(_events(gateway, "ep-3")[0]["response_ids"])


def test_a_streamed_call_is_recorded_as_the_same_call_unstreamed(gateway):
    url = f"{gateway.base_url}/s/{{}}/v1/chat/completions"
    body = {"model": "hash", "messages": USER, "max_tokens": 8, "seed": 3}
    whole = _post(url.format("whole"), body)[1]
    chunks = sse(url.format("streamed"), {**body, "stream": True})
    # The agent gets the upstream's chunks, without the ids and log-probs it did not ask for.
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "go up 3"
    assert all("prompt_token_ids" not in c for c in chunks)
    assert all(
        "token_ids" not in ch and ch["logprobs"] is None for c in chunks for ch in c["choices"]
    )
    assert len(chunks) > 3  # the role, a chunk per token, not one chunk of the whole answer
    (recorded,) = _events(gateway, "whole")
    (streamed,) = _events(gateway, "streamed")
    assert without_timing(streamed) == without_timing(recorded)
    assert whole["choices"][0]["message"]["content"] == streamed["text"]
    # Asked for, the ids and log-probs stay in each chunk: they add up to the record.
    asked = sse(
        url.format("asked"),
        {**body, "stream": True, "logprobs": True, "return_token_ids": True},
    )
    assert asked[0]["prompt_token_ids"] == recorded["prompt_ids"]
    ids = [i for c in asked[1:] for i in c["choices"][0]["token_ids"]]
    logprobs = [e["logprob"] for c in asked[1:] for e in c["choices"][0]["logprobs"]["content"]]
    assert (ids, logprobs) == (recorded["response_ids"], recorded["response_logprobs"])


def test_a_stream_reaches_the_agent_before_the_upstream_has_finished_it(tmp_path):
    hold = threading.Event()  # the upstream holds the answer after its first token until set
    slow = MockOpenAIServer(HashBackend(_answer), stream_hold=hold)
    with slow, running(GatewaySettings(slow.base_url, str(tmp_path), port=0)) as gw:
        stream = _client(gw, "first").chat.completions.create(
            model="hash", messages=USER, max_tokens=8, seed=4, stream=True
        )
        chunks = iter(stream)
        assert next(chunks).choices[0].delta.role == "assistant"
        assert next(chunks).choices[0].delta.content == "go"
        # The upstream has not finished: the call is in flight, not recorded yet.
        assert gw.in_flight == 1
        assert not (tmp_path / "first.jsonl").exists()
        hold.set()
        rest = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert rest == " up 4"
    assert slow.hold_timeouts == 0  # released by the agent's first chunk, not by the clock
    assert gw.in_flight == 0
    assert _events(gw, "first")[0]["text"] == "go up 4"


def test_an_upstream_stream_that_breaks_is_an_error_event_and_no_record(tmp_path):
    class Broken(MockOpenAIServer):
        async def _events(self, chunks):
            yield f"data: {json.dumps(chunks[0])}\n\n".encode()  # then no [DONE]

    with (
        Broken(HashBackend(_answer)) as up,
        running(GatewaySettings(up.base_url, str(tmp_path), port=0)) as gw,
    ):
        with pytest.raises(openai.APIError, match=re.escape("ended its stream without [DONE]")):
            list(
                _client(gw, "broken").chat.completions.create(
                    model="hash", messages=USER, stream=True
                )
            )
        assert gw.in_flight == 0
    assert not (tmp_path / "broken.jsonl").exists()


def test_the_session_may_be_named_by_a_header_and_must_be_named(gateway):
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="none")
    client.chat.completions.create(
        model="hash", messages=USER, max_tokens=4, extra_headers={"X-Session-Id": "by-header"}
    )
    assert len(_events(gateway, "by-header")) == 1
    with pytest.raises(openai.BadRequestError, match=re.escape("no session: name it in the URL")):
        client.chat.completions.create(model="hash", messages=USER, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match=re.escape("session name '-x' is not")):
        _client(gateway, "-x").chat.completions.create(model="hash", messages=USER)


def test_fields_that_change_the_sampled_distribution_are_refused_by_name(gateway):
    client = _client(gateway, "ep-4")
    with pytest.raises(
        openai.BadRequestError,
        match=re.escape("extra_body.logit_bias changes the distribution tokens are sampled from"),
    ) as e:
        client.chat.completions.create(model="hash", messages=USER, logit_bias={"7": 5})
    assert "remove request.logit_bias" in str(e.value)
    with pytest.raises(openai.BadRequestError, match=re.escape("n=2: the gateway records one")):
        client.chat.completions.create(model="hash", messages=USER, n=2)
    assert not (Path(gateway.settings.session_dir) / "ep-4.jsonl").exists()


def test_the_models_route_is_the_upstreams(gateway):
    assert [m.id for m in _client(gateway, "any").models.list()] == ["hash"]


def test_bodies_sessions_and_calls_in_flight_are_bounded_with_the_setting_named(tmp_path):
    slow = MockOpenAIServer(HashBackend(_answer), latency=FixedLatency(1.0), max_in_flight=8)
    settings = GatewaySettings(
        "http://127.0.0.1:9/v1",
        str(tmp_path),
        port=0,
        max_body_bytes=2000,
        max_sessions=1,
        max_in_flight=1,
    )
    with slow, running(GatewaySettings(**{**settings.__dict__, "upstream": slow.base_url})) as gw:
        status, body = _post(
            f"{gw.base_url}/s/a/v1/chat/completions", {"messages": USER, "x": "y" * 3000}
        )
        assert status == 413
        assert "over the gateway's limit of 2000 (--max-body-bytes)" in body["error"]["message"]
        first = threading.Thread(
            target=lambda: _client(gw, "a").chat.completions.create(model="hash", messages=USER)
        )
        first.start()
        while gw.in_flight == 0 and first.is_alive():
            first.join(0.01)
        assert gw.in_flight == 1
        with pytest.raises(openai.RateLimitError, match=re.escape("(--max-in-flight=1)")):
            _client(gw, "a", max_retries=0).chat.completions.create(model="hash", messages=USER)
        first.join()
        with pytest.raises(openai.RateLimitError, match=re.escape("(--max-sessions=1)")):
            _client(gw, "b", max_retries=0).chat.completions.create(model="hash", messages=USER)
        status, body = _post(f"{gw.base_url}/s/c/rewrite", {"kind": "note"})
        assert status == 429 and "(--max-sessions=1)" in body["error"]["message"]
        assert _post(f"{gw.base_url}/s/a/end", {})[0] == 200
        _client(gw, "b").chat.completions.create(model="hash", messages=USER)  # room again


def test_beyond_loopback_a_token_is_required_and_checked(upstream, tmp_path):
    with pytest.raises(ValueError, match=re.escape("host='0.0.0.0' is not loopback")):
        GatewaySettings(upstream.base_url, str(tmp_path), host="0.0.0.0")
    settings = GatewaySettings(upstream.base_url, str(tmp_path), port=0, token="s3cret")
    with running(settings) as gw:
        with pytest.raises(openai.AuthenticationError, match=re.escape("Bearer <token>")):
            _client(gw, "t").chat.completions.create(model="hash", messages=USER)
        openai.OpenAI(base_url=f"{gw.base_url}/s/t/v1", api_key="s3cret").chat.completions.create(
            model="hash", messages=USER, max_tokens=4
        )


def test_a_restarted_gateway_goes_on_with_its_sessions_and_skips_a_torn_line(upstream, tmp_path):
    settings = GatewaySettings(upstream.base_url, str(tmp_path), port=0, fsync=False)
    with running(settings) as gw:
        _client(gw, "ep").chat.completions.create(model="hash", messages=USER, seed=1)
    with (tmp_path / "ep.jsonl").open("ab") as f:
        f.write(b'{"kind": "call", "prompt_ids": [1, 2')  # the process died within a write
    with running(settings) as gw:
        assert gw.store.torn_lines == 1 and gw.store.sessions["ep"].calls == 1
        messages = [*USER, {"role": "assistant", "content": "go up 1"}, *USER]
        _client(gw, "ep").chat.completions.create(model="hash", messages=messages, seed=1)
        assert _post(f"{gw.base_url}/s/ep/end", {"reward": 1.0, "won": True})[0] == 200
    events = [json.loads(line) for line in (tmp_path / "ep.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in events] == ["call", "call", "end"]
    assert events[1]["call"] == 1
    summary = export_sessions(tmp_path, tmp_path / "rows")
    assert summary["segments"] == 1 and summary["undeclared_breaks"] == 0  # the turn extends


def _episode(gw, session: str, group: str, reward: float, rewrite: str | None = None) -> None:
    """Three calls: the second extends the first; the third's context is rewritten (declared
    by ``rewrite``'s header, or not at all)."""
    client = _client(gw, session)
    turns = [*USER]
    for k in range(2):
        text = (
            client.chat.completions.create(
                model="hash", messages=turns, seed=k, extra_headers={"X-Group-Id": group}
            )
            .choices[0]
            .message.content
        )
        turns += [{"role": "assistant", "content": text}, {"role": "user", "content": f"t{k}"}]
    summary = [{"role": "user", "content": "Summary: the box is up. What now?"}]
    headers = {"X-Memory-Rewrite": rewrite} if rewrite else {}
    client.chat.completions.create(model="hash", messages=summary, seed=9, extra_headers=headers)
    assert _post(f"{gw.base_url}/s/{session}/reward", {"reward": reward})[0] == 200
    assert _post(f"{gw.base_url}/s/{session}/end", {"won": reward > 0})[0] == 200


def test_sessions_export_as_rollout_rows_with_declared_segments_and_flagged_breaks(
    gateway, tmp_path
):
    _episode(gateway, "a", "g", 1.0, rewrite="compaction")
    _episode(gateway, "b", "g", 0.0)  # the same rewrite, undeclared
    proc = export(Path(gateway.settings.session_dir), tmp_path / "rows")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "rows"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sessions"] == 2 and summary["open_sessions"] == 0
    assert summary["declared_rewrites"] == {"compaction": 1}
    assert summary["undeclared_breaks"] == 1
    assert summary["undeclared_break_calls"] == [{"session": "b", "call": 3}]
    assert summary["segments"] == 4 and summary["episodes"] == 2
    rows = pq.read_table(out / "trajectories.parquet")
    assert rows.schema == row_schema(ROW_COLUMNS)
    rows = rows.to_pylist()
    assert [(r["traj_uid"], r["step"], r["memory_flag"]) for r in rows] == [
        ("a", 1, None),
        ("a", 2, None),
        ("a", 3, "compaction"),
        ("b", 1, None),
        ("b", 2, None),
        ("b", 3, "undeclared_break"),
    ]
    # GRPO over the group: the won session above, the other below.
    assert {r["traj_uid"]: round(r["advantage"], 3) for r in rows} == {"a": 0.707, "b": -0.707}
    assert [r["reward"] for r in rows] == [0, 0, 1.0, 0, 0, 0]
    assert [r["terminated"] for r in rows] == [False, False, True] * 2
    calls = _events(gateway, "a")
    assert [r["prompt_ids"] for r in rows[:3]] == [c["prompt_ids"] for c in calls[:3]]
    assert [r["response_logprobs"] for r in rows[:3]] == [c["response_logprobs"] for c in calls[:3]]
    episodes = pq.read_table(out / "episodes.parquet")
    assert episodes.schema == row_schema(EPISODE_COLUMNS)
    samples = episodes.to_pylist()
    assert [(s["traj_uid"], s["segment"], s["segments"], s["turns"]) for s in samples] == [
        ("a", 0, 2, 2),
        ("a", 1, 2, 1),
        ("b", 0, 2, 2),
        ("b", 1, 2, 1),
    ]
    first, second = calls[0], calls[1]
    # One segment: the first prompt, then the first response, the env's tokens, the second.
    assert samples[0]["prompt_ids"] == first["prompt_ids"]
    n = len(first["prompt_ids"]) + len(first["response_ids"])
    assert samples[0]["completion_ids"] == (
        first["response_ids"] + second["prompt_ids"][n:] + second["response_ids"]
    )
    assert samples[1]["prompt_ids"] == calls[2]["prompt_ids"]


def test_the_rewrite_endpoint_declares_the_next_call(gateway):
    client = _client(gateway, "r")
    client.chat.completions.create(model="hash", messages=USER)
    assert _post(f"{gateway.base_url}/s/r/rewrite", {"kind": "fold"})[0] == 200
    status, body = _post(f"{gateway.base_url}/s/r/rewrite", {"kind": "shrink"})
    assert (
        status == 400
        and "'kind' must be one of ('compaction', 'note', 'fold')" in body["error"]["message"]
    )
    client.chat.completions.create(model="hash", messages=[{"role": "user", "content": "new"}])
    assert [e.get("rewrite") for e in _events(gateway, "r") if e["kind"] == "call"] == [
        None,
        "fold",
    ]


def test_rewards_and_ends_are_checked(gateway):
    url = f"{gateway.base_url}/s/z"
    status, body = _post(f"{url}/reward", {"reward": 1.0})
    assert status == 409 and "has no call to reward yet" in body["error"]["message"]
    _client(gateway, "z").chat.completions.create(model="hash", messages=USER)
    status, body = _post(f"{url}/reward", {"reward": "lots"})
    assert (
        status == 400 and "'reward' must be a finite number, got 'lots'" in body["error"]["message"]
    )
    assert _post(f"{url}/end", {"truncated": True})[0] == 200
    with pytest.raises(openai.ConflictError, match=re.escape("session 'z' has ended")):
        _client(gateway, "z", max_retries=0).chat.completions.create(model="hash", messages=USER)


def test_a_killed_agent_and_gateway_leave_their_finished_calls_exportable(upstream, tmp_path):
    sessions = tmp_path / "sessions"
    with gateway_process(upstream.base_url, sessions) as (url, proc, _):
        client = openai.OpenAI(base_url=f"{url}/s/crash/v1", api_key="none")
        client.chat.completions.create(model="hash", messages=USER, seed=3)
        proc.kill()  # mid-episode: no end, the gateway gone without a goodbye
    with gateway_process(upstream.base_url, sessions) as (url, _, line):
        assert "1 sessions in" in line
        openai.OpenAI(base_url=f"{url}/s/crash/v1", api_key="none").chat.completions.create(
            model="hash", messages=[*USER, {"role": "assistant", "content": "go up 3"}, *USER]
        )
    proc = export(sessions, tmp_path / "rows")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["open_sessions"] == 1
    rows = [
        json.loads(line) for line in (tmp_path / "rows/trajectories.jsonl").read_text().splitlines()
    ]
    assert [(r["step"], r["truncated"], r["terminated"]) for r in rows] == [
        (1, False, False),
        (2, True, False),
    ]


def test_store_refuses_a_file_changed_by_hand(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"kind": "call"}\nnot json\n{"kind": "end"}\n')
    with pytest.raises(ValueError, match=re.escape("s.jsonl, line 2: expected a JSON object")):
        SessionStore(tmp_path)


def test_a_keep_alive_connection_the_upstream_drops_is_retried_on_a_new_one(tmp_path):
    # An upstream that answers each connection's first request and drops the connection at the
    # second (its keep-alive ended as the request was sent): the agent still gets its answer.
    answer = b'{"object": "list", "data": [{"id": "m"}]}'

    async def serve(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(answer)}\r\n\r\n".encode()
        writer.write(head + answer)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")  # the second request: dropped unanswered
        writer.close()

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(serve, "127.0.0.1", 0))
    threading.Thread(target=loop.run_forever, daemon=True).start()
    upstream = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    try:
        with running(GatewaySettings(upstream, str(tmp_path), port=0)) as gw:
            client = _client(gw, "k", max_retries=0)
            assert [m.id for m in client.models.list()] == ["m"]
            assert [m.id for m in client.models.list()] == ["m"]  # the same connection, dropped
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
