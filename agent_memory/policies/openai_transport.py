"""The ``httpx`` async transport of :class:`~agent_memory.policies.openai_client.OpenAIPolicy`:
HTTP/1.1 (``h11``) over the event loop's own sockets, keep-alive connections reused
most-recent-first. httpx's default pool scans every connection per request (with hundreds in
flight, the pool takes most of the client's CPU); here a request takes the last idle one. No
timeout per phase: the caller bounds the whole request (``asyncio.timeout``).

Example:
    >>> import asyncio, httpx
    >>> async def refused() -> str:
    ...     async with httpx.AsyncClient(transport=Transport()) as client:
    ...         try:
    ...             await client.get("http://127.0.0.1:9/")  # nothing listens on port 9
    ...         except httpx.ConnectError as e:
    ...             return str(e)
    ...     return "answered"
    >>> asyncio.run(refused())
    '[Errno 111] Connection refused'
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from typing import Any

import h11
import httpx

__all__ = ["Transport"]

Origin = tuple[bytes, bytes, int]


def _describe(e: BaseException) -> str:
    """A socket error as a blocking socket words it ("[Errno 111] Connection refused", where
    asyncio says "Connect call failed ('127.0.0.1', 9)")."""
    if isinstance(e, OSError) and not isinstance(e, ssl.SSLError) and e.errno and e.errno > 0:
        return f"[Errno {e.errno}] {os.strerror(e.errno)}"
    return str(e) or type(e).__name__


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: what the socket received, and one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, open_: set[_Connection]) -> None:
        self.loop = loop
        self.open = open_
        self.h11 = h11.Connection(h11.CLIENT)
        self.transport: asyncio.Transport | None = None
        self.received = bytearray()
        self.eof = False
        self.error: BaseException | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.idle_since = 0.0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.open.add(self)

    def data_received(self, data: bytes) -> None:
        self.received += data
        self._wake()

    def eof_received(self) -> None:
        self.eof = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof, self.error = True, exc
        self.open.discard(self)
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def reusable(self, expiry: float | None) -> bool:
        """Still open, nothing unasked-for received, idle for at most ``expiry`` seconds."""
        assert self.transport is not None
        expired = expiry is not None and time.monotonic() - self.idle_since > expiry
        return not (self.eof or self.received or expired or self.transport.is_closing())

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.open.discard(self)

    async def exchange(self, request: httpx.Request, body: bytes) -> httpx.Response:
        """Send ``request``, read the whole answer; the connection is closed on any error
        (cancellation included) and when the answer leaves it unusable."""
        assert self.transport is not None
        h = self.h11
        try:
            head = h11.Request(
                method=request.method, target=request.url.raw_path, headers=request.headers.raw
            )
            data = h.send(head) + h.send(h11.Data(data=body)) + h.send(h11.EndOfMessage())
            self.transport.write(data)
            response: h11.Response | None = None
            chunks: list[bytes] = []
            while True:
                event = h.next_event()
                if event is h11.NEED_DATA:
                    data = await self._receive()
                    if not data and h.their_state is h11.SEND_RESPONSE:
                        raise httpx.RemoteProtocolError(
                            "Server disconnected without sending a response."
                        )
                    h.receive_data(data)
                elif isinstance(event, h11.Response):
                    response = event
                elif isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
        except BaseException as e:
            self.close()
            if isinstance(e, h11.RemoteProtocolError):
                raise httpx.RemoteProtocolError(str(e)) from e
            if isinstance(e, h11.LocalProtocolError):
                raise httpx.LocalProtocolError(str(e)) from e
            raise
        assert response is not None  # a stream that ended before one raised above
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            self.idle_since = time.monotonic()
        else:
            self.close()
        return httpx.Response(
            response.status_code,
            headers=list(response.headers),
            stream=httpx.ByteStream(b"".join(chunks)),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": bytes(response.reason)},
        )

    async def _receive(self) -> bytes:
        """What came since the last call; ``b""`` at the end of the stream.

        Raises:
            httpx.ReadError: the connection broke (reset).
        """
        while not self.received and not self.eof:
            self.waiter = self.loop.create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        if self.received:
            data = bytes(self.received)
            self.received.clear()
            return data
        if self.error is not None:
            raise httpx.ReadError(_describe(self.error))
        return b""


class Transport(httpx.AsyncBaseTransport):
    """Keep-alive HTTP/1.1 connections of one event loop: one per request in flight, the idle
    ones reused (the last one first), at most ``limits.max_keepalive_connections`` of them kept
    for at most ``limits.keepalive_expiry`` seconds.

    Args:
        limits: as ``httpx`` takes them (``max_connections`` unenforced: the caller bounds it).
        verify: TLS verification, as ``httpx.create_ssl_context`` takes it.
    """

    def __init__(self, limits: httpx.Limits | None = None, verify: Any = True) -> None:
        limits = limits or httpx.Limits()
        self.keep = limits.max_keepalive_connections
        self.expiry = limits.keepalive_expiry
        self.verify = verify
        self.idle: dict[Origin, list[_Connection]] = {}
        self.open: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        origin = (url.raw_scheme, url.raw_host, url.port or (443 if url.scheme == "https" else 80))
        body = await request.aread()
        idle = self.idle.setdefault(origin, [])
        while idle:
            conn = idle.pop()
            if conn.reusable(self.expiry):
                break
            conn.close()
        else:
            conn = await self._connect(origin)
        response = await conn.exchange(request, body)
        if conn.transport is not None and not conn.transport.is_closing():
            if self.keep is None or len(idle) < self.keep:
                idle.append(conn)
            else:
                conn.close()
        return response

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        if scheme == b"https" and self._ssl is None:
            self._ssl = httpx.create_ssl_context(verify=self.verify)
        tls = self._ssl if scheme == b"https" else None
        try:
            _, conn = await loop.create_connection(
                lambda: _Connection(loop, self.open), host.decode("ascii"), port, ssl=tls
            )
        except OSError as e:
            raise httpx.ConnectError(_describe(e)) from e
        return conn

    async def aclose(self) -> None:
        for conn in list(self.open):
            conn.close()
        self.idle.clear()
