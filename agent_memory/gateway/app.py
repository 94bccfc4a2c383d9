"""The gateway: an OpenAI-compatible server in front of an upstream (vLLM) that records every
chat call's prompt ids, sampled ids and sampling log-probs into its session's file
(:mod:`~agent_memory.gateway.records`), and takes a session's rewards, declared memory rewrites
and end. Routes (a session is named in the URL, ``/s/<session>/v1/...``, or by the
``X-Session-Id`` header on ``/v1/...``):

- ``POST .../v1/chat/completions``: a chat call (``stream`` or not); header
  ``X-Memory-Rewrite: compaction|note|fold`` declares that the agent's memory rewrote this
  call's context (a new segment), ``X-Group-Id`` names the session's group (GRPO),
  ``X-State-Key`` the state the call acts in (GiGPO's step groups; else the last message);
- ``GET .../v1/models``: the upstream's;
- ``POST /s/<session>/reward`` ``{"reward": r}``: adds ``r`` to the last call's reward;
- ``POST /s/<session>/rewrite`` ``{"kind": "compaction"}``: the next call is a declared rewrite;
- ``POST /s/<session>/end`` ``{"reward"?, "won"?, "truncated"?, "group"?}``: ends the session.

Example:
    >>> import asyncio, tempfile
    >>> async def demo() -> int:
    ...     gateway = Gateway(GatewaySettings("http://127.0.0.1:9/v1", tempfile.mkdtemp(), port=0))
    ...     await gateway.start()
    ...     try:
    ...         r = await gateway.handle(Request("POST", "/s/a/end", "", {}, b"{}"))
    ...     finally:
    ...         await gateway.close()
    ...     return r.status
    >>> asyncio.run(demo())
    200
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from agent_memory.checks import is_number
from agent_memory.gateway.calls import (
    Prepared,
    agent_answer,
    prepare,
    read_sampled,
    text_mismatch,
)
from agent_memory.gateway.http_server import (
    HttpError,
    HttpServer,
    Request,
    Response,
    error_response,
    json_response,
    start,
)
from agent_memory.gateway.records import REWRITES, SessionStore, check_session
from agent_memory.gateway.settings import GatewaySettings
from agent_memory.gateway.streaming import DONE, StreamedAnswer, sse_data
from agent_memory.policies.openai_checks import check_logprobs
from agent_memory.policies.openai_protocol import LogprobsKind, logprobs_kind, probe_fields
from agent_memory.policies.openai_runtime import LogprobsNotSampled
from agent_memory.policies.openai_transport import AnswerTooLarge, Target, Transport

__all__ = ["Gateway"]

_JSON = [(b"Content-Type", b"application/json")]
_JSON_H = {"Content-Type": "application/json"}


class Gateway:
    """The gateway of ``settings`` (see the module docstring); :meth:`start` it in a running
    event loop, :meth:`close` it after."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.store = SessionStore(settings.session_dir, fsync=settings.fsync)
        base = settings.upstream.rstrip("/")
        self.chat_url = base + "/chat/completions"
        self._chat = Target(self.chat_url)
        self._models = Target(base + "/models")
        # Idle connections are reused for 2 s, under uvicorn's (vLLM's) 5 s keep-alive.
        self.transport = Transport(expiry=2.0)
        # Streams: httpx's client, each read within the upstream's timeout.
        self.streams = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.upstream_timeout_s),
            limits=httpx.Limits(keepalive_expiry=2.0),
        )
        self.in_flight = 0
        self.tokenizer = None if settings.tokenizer is None else _tokenizer(settings.tokenizer)
        self.logprobs_kind: LogprobsKind | None = None
        self._probe = asyncio.Lock()
        self._server: HttpServer | None = None

    async def start(self) -> None:
        """Listen on the settings' host and port."""
        self._server = await start(
            self.handle,
            self.settings.host,
            self.settings.port,
            max_body_bytes=self.settings.max_body_bytes,
        )

    @property
    def base_url(self) -> str:
        """``http://host:port`` (the port chosen, when it was 0)."""
        assert self._server is not None, "start() first"
        return f"http://{self.settings.host}:{self._server.port}"

    async def close(self) -> None:
        """Stop listening, let the records' fsyncs end, close the upstream connections."""
        if self._server is not None:
            await self._server.close()
        await self.store.drain()
        await self.transport.aclose()
        await self.streams.aclose()

    async def handle(self, request: Request) -> Response:
        """Answer one request (the routes of the module docstring)."""
        token = self.settings.token
        if token is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return error_response(
                    401,
                    "the gateway needs 'Authorization: Bearer <token>' with its --token "
                    "(the openai client sends api_key so)",
                    "authentication_error",
                )
        session, route = _route(request)
        if route == "/v1/chat/completions" and request.method == "POST":
            return await self._chat_call(request, _session(session, request))
        if route == "/v1/models" and request.method == "GET":
            reply = await self._upstream(self._models, b"GET", b"")
            return Response(reply.status_code, reply.content)
        if session is not None and route in ("/reward", "/rewrite", "/end"):
            if request.method != "POST":
                raise HttpError(405, f"{request.path} takes POST")
            return await self._event(_session(session, request), route[1:], _json(request.body))
        raise HttpError(
            404,
            f"no route {request.method} {request.path}: expected POST /s/<session>/v1/chat/"
            "completions (or /v1/chat/completions with X-Session-Id), GET .../v1/models, or "
            "POST /s/<session>/reward, /rewrite, /end",
        )

    async def _chat_call(self, request: Request, session: str) -> Response:
        state = self.store.sessions.get(session)
        if state is not None and state.ended:
            raise HttpError(409, f"session {session!r} has ended: name a new session")
        if state is None:
            self._room_for_a_session()
        if self.in_flight >= self.settings.max_in_flight:
            raise HttpError(
                429,
                f"{self.in_flight} calls are in flight, the gateway's limit "
                f"(--max-in-flight={self.settings.max_in_flight}): retry later, or raise "
                "--max-in-flight",
                "rate_limit_error",
            )
        rewrite = request.headers.get("x-memory-rewrite")
        if rewrite is not None and rewrite not in REWRITES:
            raise HttpError(400, f"X-Memory-Rewrite must be one of {REWRITES}, got {rewrite!r}")
        call = prepare(_json(request.body))
        self.in_flight += 1
        streaming = False  # a stream's events leave the call in flight until they end
        try:
            kind = await self._kind(call)
            try:
                check_logprobs(kind, self.chat_url, call.sampling)
            except LogprobsNotSampled as e:
                raise HttpError(400, str(e)) from None
            if call.stream:
                response = await self._stream(request, session, call)
                streaming = response.stream is not None
                return response
            started = time.perf_counter()
            reply = await self._upstream(self._chat, b"POST", json.dumps(call.upstream).encode())
            if reply.status_code != 200:  # the upstream's refusal, as it gave it
                return Response(reply.status_code, reply.content)
            data = _json(reply.content, status=502)
            await self._record(request, session, call, data, time.perf_counter() - started)
        finally:
            if not streaming:
                self.in_flight -= 1
        return json_response(200, agent_answer(data, call))

    async def _stream(self, request: Request, session: str, call: Prepared) -> Response:
        """A streamed call: the upstream's chunks passed on as they come (what the agent did not
        ask for removed from each), the call recorded when the upstream's stream ends, before
        its ``[DONE]`` is passed on. The call stays in flight until the stream ends."""
        started = time.perf_counter()
        reply = await self._open_stream(json.dumps(call.streamed()).encode())
        if reply.status_code != 200:  # the upstream's refusal, as it gave it
            try:
                return Response(reply.status_code, await reply.aread())
            finally:
                await reply.aclose()

        released = False

        async def release() -> None:
            """The call is out of flight, its upstream answer closed (once)."""
            nonlocal released
            if not released:
                released = True
                self.in_flight -= 1
                await reply.aclose()

        async def events() -> AsyncGenerator[bytes, None]:
            answer, last = StreamedAnswer(), b"data: [DONE]\n\n"
            try:
                async for line in reply.aiter_lines():
                    data = sse_data(line)
                    if data is None:
                        continue
                    if data == DONE:
                        whole = answer.answer()
                        seconds = time.perf_counter() - started
                        await self._record(request, session, call, whole, seconds)
                        break
                    chunk = _json(data.encode(), status=502)
                    if isinstance(chunk, dict) and "error" in chunk:  # vLLM's error mid-stream
                        last = f"data: {data}\n\n".encode()
                        break
                    answer.add(chunk)
                    text = json.dumps(agent_answer(chunk, call), ensure_ascii=False)
                    yield f"data: {text}\n\n".encode()
                else:
                    raise HttpError(
                        502, f"the upstream at {self.chat_url} ended its stream without [DONE]"
                    )
            except (HttpError, httpx.TransportError) as e:  # told as vLLM tells a stream's error
                if not isinstance(e, HttpError):
                    message = f"the upstream at {self.chat_url} broke its stream off ({e!r})"
                    e = HttpError(502, message, "upstream_error")
                error = {"error": {"message": e.message, "type": e.kind, "code": e.status}}
                last = f"data: {json.dumps(error)}\n\n".encode()
            finally:
                await release()
            yield last

        return Response(200, b"", "text/event-stream", stream=events())

    async def _open_stream(self, body: bytes) -> httpx.Response:
        """The upstream's streamed answer, its head read (asked once more, on a new connection,
        when a reused one was closed under the request)."""
        request = self.streams.build_request("POST", self.chat_url, content=body, headers=_JSON_H)
        try:
            try:
                return await self.streams.send(request, stream=True)
            except (httpx.ReadError, httpx.RemoteProtocolError):
                return await self.streams.send(request, stream=True)
        except httpx.TransportError as e:
            raise HttpError(
                502,
                f"the upstream at {self.chat_url} gave no answer ({type(e).__name__}: {e}): is "
                "it running (--upstream)?",
                "upstream_error",
            ) from None

    async def _record(
        self, request: Request, session: str, call: Prepared, data: Any, seconds: float
    ) -> None:
        """Append the call of the upstream's whole answer ``data`` to ``session``'s file, and
        wait until it is durable (:meth:`SessionStore.commit`).

        Raises:
            HttpError: 502: the answer does not hold the call's tokens (:func:`read_sampled`).
        """
        sampled = read_sampled(data, self.chat_url)
        state = self.store.sessions.get(session)
        pending = state.pending_rewrite if state is not None else None
        await self.store.commit(
            session,
            {
                "kind": "call",
                "call": state.calls if state is not None else 0,
                "time": time.time(),
                "upstream_seconds": seconds,
                "rewrite": request.headers.get("x-memory-rewrite") or pending,
                "group": request.headers.get("x-group-id"),
                "state_key": request.headers.get("x-state-key"),
                "messages": call.upstream["messages"],
                "tools": call.upstream.get("tools"),
                "model": call.upstream.get("model"),
                "sampling": call.sampling.__dict__,
                "prompt_ids": sampled.prompt_ids,
                "response_ids": sampled.response_ids,
                "response_logprobs": sampled.logprobs,
                "finish_reason": sampled.finish_reason,
                "text": sampled.text,
                "tool_calls": sampled.tool_calls,
                "mismatch": None
                if self.tokenizer is None
                else text_mismatch(self.tokenizer, sampled),
            },
        )

    def _room_for_a_session(self) -> None:
        """Raise a 429 when ``max_sessions`` sessions are open."""
        if self.store.open_sessions >= self.settings.max_sessions:
            raise HttpError(
                429,
                f"{self.store.open_sessions} sessions are open, the gateway's limit "
                f"(--max-sessions={self.settings.max_sessions}): end sessions "
                "(POST /s/<session>/end), or raise --max-sessions",
                "rate_limit_error",
            )

    async def _kind(self, call: Prepared) -> LogprobsKind:
        """Which log-probs the upstream reports (asked once, by a one-token call)."""
        async with self._probe:
            if self.logprobs_kind is None:
                body = {
                    "model": call.upstream.get("model"),
                    "messages": [{"role": "user", "content": "Hi"}],
                    **probe_fields("chat", "vllm"),
                }
                reply = await self._upstream(self._chat, b"POST", json.dumps(body).encode())
                try:
                    data = reply.json() if reply.status_code == 200 else None
                except ValueError:
                    data = None
                self.logprobs_kind = "unknown" if data is None else logprobs_kind(data, "chat")
            return self.logprobs_kind

    async def _upstream(self, target: Target, method: bytes, body: bytes) -> Any:
        """The upstream's answer; asked once more, on a new connection, when a reused one was
        closed under the request (a keep-alive ending as it was sent): the first try left no
        answer, so nothing of it is recorded."""
        try:
            async with asyncio.timeout(self.settings.upstream_timeout_s):
                try:
                    return await self.transport.request(target, method, _JSON, body)
                except (httpx.ReadError, httpx.RemoteProtocolError):
                    return await self.transport.request(target, method, _JSON, body)
        except (httpx.TransportError, AnswerTooLarge, TimeoutError) as e:
            raise HttpError(
                502,
                f"the upstream at {target.url} gave no answer ({type(e).__name__}: {e}): is it "
                "running (--upstream)?",
                "upstream_error",
            ) from None

    async def _event(self, session: str, kind: str, body: Any) -> Response:
        """A reward, a declared rewrite or the end of ``session``."""
        state = self.store.sessions.get(session)
        if state is not None and state.ended:
            raise HttpError(409, f"session {session!r} has ended: name a new session")
        if not isinstance(body, dict):
            raise HttpError(400, f"expected a JSON object, got {body!r}"[:200])
        event: dict[str, Any] = {"kind": kind, "time": time.time()}
        if kind == "rewrite":
            if state is None:
                self._room_for_a_session()
            rewrite = body.get("kind")
            if rewrite not in REWRITES:
                raise HttpError(400, f"'kind' must be one of {REWRITES}, got {rewrite!r}")
            event["rewrite"] = rewrite
        if kind == "reward" or "reward" in body:
            reward: Any = body.get("reward")
            if not is_number(reward) or not math.isfinite(reward):
                raise HttpError(400, f"'reward' must be a finite number, got {reward!r}")
            if state is None or not state.calls:
                raise HttpError(409, f"session {session!r} has no call to reward yet")
            event["reward"] = float(reward)
            event["after"] = state.calls
        if kind == "end":
            for name in ("won", "truncated"):
                if not isinstance(body.get(name, False), bool):
                    raise HttpError(400, f"'{name}' must be true or false, got {body[name]!r}")
                event[name] = body.get(name, False)
            if body.get("group") is not None:
                event["group"] = str(body["group"])
        await self.store.commit(session, event)
        return json_response(200, {"session": session, "event": kind})


def _tokenizer(path: str) -> Any:
    """The local tokenizer ``path`` (a directory or a cached hub id)."""
    from transformers import AutoTokenizer

    from agent_memory.policies.local_model import resolve_model

    local = resolve_model(path, need="tokenizer", key="--tokenizer")
    return AutoTokenizer.from_pretrained(str(local), local_files_only=True)


def _route(request: Request) -> tuple[str | None, str]:
    """The session named in the path (None: none) and the route after it.

    Example:
        >>> _route(Request("GET", "/s/ep-1/v1/models", "", {}, b""))
        ('ep-1', '/v1/models')
        >>> _route(Request("GET", "/v1/models", "", {}, b""))
        (None, '/v1/models')
    """
    path = request.path
    if path.startswith("/s/"):
        session, _, rest = path[3:].partition("/")
        return session, "/" + rest
    return None, path


def _session(named: str | None, request: Request) -> str:
    session = named or request.headers.get("x-session-id")
    if not session:
        raise HttpError(
            400,
            "no session: name it in the URL (base_url http://<gateway>/s/<session>/v1) or send "
            "the X-Session-Id header",
        )
    try:
        return check_session(session)
    except ValueError as e:
        raise HttpError(400, str(e)) from None


def _json(body: bytes, status: int = 400) -> Any:
    try:
        return json.loads(body or b"{}")
    except ValueError as e:
        raise HttpError(status, f"expected a JSON body: {e}") from None
