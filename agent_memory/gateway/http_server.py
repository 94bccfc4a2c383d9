"""The gateway's HTTP/1.1 server side over asyncio streams: one request at a time per
keep-alive connection, ``Content-Length`` bodies within a byte cap (413 beyond it, 411 for a
chunked one), a bounded head, and answers written whole, or, for a stream, chunk by chunk as
they come (``Transfer-Encoding: chunked``).

Example:
    >>> import asyncio, urllib.request
    >>> async def handler(request: Request) -> Response:
    ...     return json_response(200, {"path": request.path, "query": request.query})
    >>> async def demo() -> bytes:
    ...     server = await start(handler, "127.0.0.1", 0, max_body_bytes=1024)
    ...     url = f"http://127.0.0.1:{server.port}/v1/models?x=1"
    ...     text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read())
    ...     await server.close()
    ...     return text
    >>> asyncio.run(demo())
    b'{"path": "/v1/models", "query": "x=1"}'
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

__all__ = [
    "MAX_HEAD_BYTES",
    "HttpError",
    "HttpServer",
    "Request",
    "Response",
    "error_response",
    "json_response",
    "start",
]

#: The most bytes a request's head may take (431 beyond it).
MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Request:
    """One request: its method, path (no query), query, headers (lower-case names) and body."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Response:
    """One answer: its ``body`` written whole, or (``stream``) each piece as it comes, chunked;
    a stream that raises ends its connection (the client sees an unfinished answer)."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: Mapping[str, str] = field(default_factory=dict)
    stream: AsyncGenerator[bytes, None] | None = None


class HttpError(Exception):
    """A request the gateway refuses: its status, and a message that names the fix."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def json_response(status: int, payload: Any, headers: Mapping[str, str] | None = None) -> Response:
    """``payload`` as a JSON answer."""
    body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
    return Response(status, body, headers=dict(headers or {}))


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> Response:
    """An error in the OpenAI API's shape (the ``openai`` client shows its message).

    Example:
        >>> error_response(429, "busy").body
        b'{"error": {"message": "busy", "type": "invalid_request_error", "code": 429}}'
    """
    return json_response(status, {"error": {"message": message, "type": kind, "code": status}})


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """A listening server of ``handler`` (see :func:`start`); :meth:`close` ends its
    connections too (keep-alive ones included, where ``asyncio.Server.close`` leaves them)."""

    def __init__(self, handler: Handler, max_body_bytes: int) -> None:
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.server: asyncio.base_events.Server | None = None
        self.connections: set[asyncio.Task[Any]] = set()

    @property
    def port(self) -> int:
        """The port listened on."""
        assert self.server is not None, "not started"
        return int(self.server.sockets[0].getsockname()[1])

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            await _serve(reader, writer, self.handler, self.max_body_bytes)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the server closes
        finally:
            self.connections.discard(task)
            writer.close()

    async def close(self) -> None:
        """Stop listening; end every connection."""
        if self.server is not None:
            self.server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()


async def start(handler: Handler, host: str, port: int, *, max_body_bytes: int) -> HttpServer:
    """Serve ``handler`` on ``host``:``port`` (0: a free port); returns the listening server."""
    http = HttpServer(handler, max_body_bytes)
    http.server = await asyncio.start_server(http.connection, host, port, limit=MAX_HEAD_BYTES)
    return http


async def _serve(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: Handler,
    max_body_bytes: int,
) -> None:
    """Requests of one connection, answered in turn, until it closes or asks to."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return  # closed between requests
        except asyncio.LimitOverrunError:
            await _write(writer, error_response(431, f"request head over {MAX_HEAD_BYTES} bytes"))
            return
        try:
            method, target, headers, closes = _parse_head(head)
            body = await _body(reader, headers, max_body_bytes)
        except HttpError as e:
            await _write(writer, error_response(e.status, e.message, e.kind), close=True)
            return
        path, _, query = target.partition("?")
        try:
            response = await handler(Request(method, path, query, headers, body))
        except HttpError as e:
            response = error_response(e.status, e.message, e.kind)
        await _write(writer, response, close=closes)
        if closes:
            return


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str], bool]:
    """The request line and header fields of ``head``, and whether the client closes after."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"expected a request line 'METHOD /path HTTP/1.1', got {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, f"expected a header field 'name: value', got {line[:60]!r}")
        key = name.lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    connection = headers.get("connection", "").lower()
    closes = "close" in connection or (parts[2] == "HTTP/1.0" and "keep-alive" not in connection)
    return parts[0], parts[1], headers, closes


async def _body(reader: asyncio.StreamReader, headers: Mapping[str, str], cap: int) -> bytes:
    """The request's body, at most ``cap`` bytes."""
    if "transfer-encoding" in headers:
        raise HttpError(411, "chunked request bodies are not read: send a Content-Length")
    raw = headers.get("content-length", "0")
    if not raw.isdigit():
        raise HttpError(400, f"Content-Length must be a non-negative integer, got {raw!r}")
    length = int(raw)
    if length > cap:
        raise HttpError(
            413,
            f"the request body is {length} bytes, over the gateway's limit of {cap} "
            "(--max-body-bytes): raise it, or send a shorter conversation",
        )
    return await reader.readexactly(length)


async def _write(writer: asyncio.StreamWriter, response: Response, close: bool = False) -> None:
    status = response.status
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Unknown"
    stream = response.stream
    size = "Transfer-Encoding: chunked" if stream else f"Content-Length: {len(response.body)}"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        f"Content-Type: {response.content_type}",
        size,
        *(f"{k}: {v}" for k, v in response.headers.items()),
    ]
    if close:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    if stream is None:
        writer.write(head + response.body)
        await writer.drain()
        return
    try:
        piece = await anext(stream, None)  # started: its own clean-up runs, come what may
        writer.write(head)
        while piece is not None:
            if piece:
                writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                await writer.drain()
            piece = await anext(stream, None)
    except (ConnectionError, asyncio.CancelledError):
        raise
    except Exception as e:  # the stream broke: end the connection, the answer unfinished
        raise ConnectionError(f"the stream ended early: {type(e).__name__}: {e}") from e
    finally:
        await stream.aclose()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
