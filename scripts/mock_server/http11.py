"""A minimal asyncio HTTP/1.1 JSON server: keep-alive, ``Content-Length`` bodies (chunked ones
get 411), one coroutine per connection; ``handler(method, path, body)`` returns
``(status, payload)``, written as JSON (``bytes`` as they are; an async iterator of ``bytes``:
server-sent events, each piece written as it comes, chunked).

Example:
    >>> import asyncio, urllib.request
    >>> async def handler(method, path, body):
    ...     return 200, {"method": method, "path": path}
    >>> async def demo():
    ...     server = HttpServer(handler)
    ...     port = await server.start(0)
    ...     url = f"http://127.0.0.1:{port}/x?q=1"
    ...     text = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read())
    ...     await server.close()
    ...     return text
    >>> asyncio.run(demo())
    b'{"method": "GET", "path": "/x"}'
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any

__all__ = ["HOST", "Handler", "HttpServer"]

#: The only address served: loopback.
HOST = "127.0.0.1"

#: ``(method, path without query, body) -> (status, JSON-able payload or bytes)``.
Handler = Callable[[str, str, bytes], Awaitable[tuple[int, Any]]]

_MAX_BODY = 32 * 2**20
_MAX_HEAD = 64 * 2**10


class _HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class HttpServer:
    """Serves ``handler`` on ``127.0.0.1`` from the running event loop."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    async def start(self, port: int = 0) -> int:
        """Bind (``port`` 0 picks a free one) and accept; returns the port."""
        self._server = await asyncio.start_server(
            self._connection, HOST, port, backlog=1024, limit=_MAX_HEAD
        )
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        """Stop accepting and drop every open connection (requests in progress are cancelled)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.LimitOverrunError:
                    writer.write(_response(431, {"detail": "Request Header Fields Too Large"}))
                    return
                try:
                    method, path, headers, keep_alive = _parse_head(head)
                    length = int(headers.get("content-length", "0"))
                    if not 0 <= length <= _MAX_BODY:
                        raise _HttpError(413 if length > 0 else 400)
                    if length and headers.get("expect", "").lower() == "100-continue":
                        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it
                    body = await reader.readexactly(length) if length else b""
                except _HttpError as e:
                    writer.write(_response(e.status, {"detail": HTTPStatus(e.status).phrase}))
                    return
                except (ValueError, asyncio.IncompleteReadError):
                    writer.write(_response(400, {"detail": "Bad Request"}))
                    return
                status, payload = await self.handler(method, path, body)
                if isinstance(payload, AsyncIterator):
                    await _stream(writer, status, payload, keep_alive)
                else:
                    writer.write(_response(status, payload, keep_alive))
                    await writer.drain()
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(task)
            writer.close()


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str], bool]:
    """Request line and headers -> ``(method, path, headers, keep_alive)``."""
    lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise _HttpError(411)
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    return method, target.split("?", 1)[0], headers, keep_alive


async def _stream(
    writer: asyncio.StreamWriter, status: int, pieces: AsyncIterator[bytes], keep_alive: bool
) -> None:
    """Write ``pieces`` as a chunked ``text/event-stream`` answer, each as it comes."""
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
    head += "content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n"
    if not keep_alive:
        head += "connection: close\r\n"
    writer.write((head + "\r\n").encode("latin-1"))
    async for piece in pieces:
        writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def _response(status: int, payload: Any, keep_alive: bool = False) -> bytes:
    """A complete HTTP/1.1 response with a JSON (or raw bytes) body."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
    )
    if not keep_alive:
        head += "connection: close\r\n"
    return (head + "\r\n").encode("latin-1") + body
