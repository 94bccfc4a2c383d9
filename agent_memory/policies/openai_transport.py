"""The HTTP client of :class:`~agent_memory.policies.openai_client.OpenAIPolicy`: HTTP/1.1
(:mod:`~agent_memory.policies.http1`) over the event loop's own sockets, keep-alive connections
reused most-recent-first (why not httpx's pool: docs/benchmarks.md). A request is bytes in and a
:class:`Reply` out; the caller bounds the whole request (``asyncio.timeout``). A body is bounded
while read: ``max_answer_bytes`` as received and as inflated (a compression bomb stops at the cap).
Errors: httpx's (``ConnectError``, ``ReadError``, ``RemoteProtocolError``, ``DecodingError``) and
:class:`AnswerTooLarge`.

Example:
    >>> import asyncio, httpx
    >>> async def refused() -> str:
    ...     transport = Transport()
    ...     try:
    ...         await transport.request(Target("http://127.0.0.1:9/v1/models"), b"GET", [], b"")
    ...     except httpx.ConnectError as e:  # nothing listens on port 9
    ...         return str(e)
    ...     finally:
    ...         await transport.aclose()
    ...     return "answered"
    >>> asyncio.run(refused())
    '[Errno 111] Connection refused'
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import h11
import httpx

from agent_memory.policies.http1 import (
    END,
    NEED_DATA,
    Head,
    ProtocolError,
    ResponseReader,
    request_bytes,
)
from agent_memory.policies.openai_protocol import DEFAULT_MAX_ANSWER_BYTES

__all__ = ["AnswerTooLarge", "Reply", "Target", "Transport", "encode_headers"]

Origin = tuple[bytes, bytes, int]

#: The content encodings a request accepts (and an answer may use): those inflated under the cap.
ACCEPTED_ENCODINGS = "gzip, deflate"
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class AnswerTooLarge(Exception):
    """An answer's body over the transport's byte cap (as received, or once inflated): not a
    transient error, a retry would get the same answer."""


def _describe(e: BaseException) -> str:
    """A socket error as a blocking socket words it ("[Errno 111] Connection refused", where
    asyncio says "Connect call failed ('127.0.0.1', 9)")."""
    if isinstance(e, OSError) and not isinstance(e, ssl.SSLError) and e.errno and e.errno > 0:
        return f"[Errno {e.errno}] {os.strerror(e.errno)}"
    return str(e) or type(e).__name__


class _Body:
    """An answer's body as it arrives, within ``cap`` bytes as received and, when it is gzip- or
    deflate-encoded, within ``cap`` bytes inflated (zlib's ``max_length``: never more at once).

    Example:
        >>> import gzip
        >>> body = _Body("gzip", 4096, "the answer", "max_answer_bytes")
        >>> body.feed(gzip.compress(b"ok" * 10))
        >>> body.finish()
        b'okokokokokokokokokok'
        >>> bomb = _Body("gzip", 4096, "the answer", "max_answer_bytes")
        >>> bomb.feed(gzip.compress(bytes(10**6)))  # 1 MB of zeros in 1 kB
        Traceback (most recent call last):
        ...
        agent_memory.policies.openai_transport.AnswerTooLarge: the answer is over 4096 bytes once \
inflated (gzip): expected at most max_answer_bytes=4096; raise max_answer_bytes if the server's ...
    """

    def __init__(self, encoding: str, cap: int, what: str, setting: str) -> None:
        self.encoding, self.cap, self.what, self.setting = encoding, cap, what, setting
        self.received = 0  # bytes as received
        self.size = 0  # bytes kept (inflated)
        self.chunks: list[bytes] = []
        self.inflater: Any = None
        self.head = b""  # deflate: the first bytes, until its zlib header (or none) shows

    def feed(self, data: bytes) -> None:
        """Take ``data`` as received.

        Raises:
            AnswerTooLarge: over the cap, as received or inflated.
            httpx.DecodingError: a body that does not inflate.
        """
        self.received += len(data)
        if self.received > self.cap:
            raise self.too_large("as received")
        if self.encoding:
            self._inflate(data)
        else:
            self._keep(data)

    def finish(self) -> bytes:
        """The whole body (inflated)."""
        if self.head:  # a deflate body of one byte
            self._inflate(b"", final=True)
        if self.inflater is not None:
            try:
                self._keep(self.inflater.flush())
            except zlib.error as e:
                raise self.undecodable(e) from None
        return b"".join(self.chunks)

    def _inflate(self, data: bytes, final: bool = False) -> None:
        if self.inflater is None:
            data, self.head = self.head + data, b""
            if self.encoding == "deflate" and len(data) < 2 and not final:
                self.head = data  # too short to tell a zlib header
                return
            self._start(data)
        while data and not self.inflater.eof:
            try:
                # One byte past the room left: more output than that is over the cap.
                out = self.inflater.decompress(data, self.cap - self.size + 1)
            except zlib.error as e:
                raise self.undecodable(e) from None
            self._keep(out)
            data = self.inflater.unconsumed_tail

    def _start(self, data: bytes) -> None:
        """The inflater of this encoding; deflate: zlib-wrapped (RFC 9110) or raw, as sent."""
        wbits = _WBITS[self.encoding]
        zlib_header = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
        if self.encoding == "deflate" and not zlib_header:
            wbits = -zlib.MAX_WBITS
        self.inflater = zlib.decompressobj(wbits)

    def _keep(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.cap:
            raise self.too_large(f"once inflated ({self.encoding})" if self.encoding else "")
        if data:
            self.chunks.append(data)

    def too_large(self, how: str) -> AnswerTooLarge:
        return AnswerTooLarge(
            f"{self.what} is over {self.cap} bytes{' ' + how if how else ''}: expected at most "
            f"{self.setting}={self.cap}; raise {self.setting} if the server's answers are this "
            "large"
        )

    def undecodable(self, e: zlib.error) -> httpx.DecodingError:
        return httpx.DecodingError(f"{self.what}: its {self.encoding} body does not inflate: {e}")


def _encoding(response: Head, what: str) -> str:
    """The answer's content encoding: "" (identity) or one of :data:`ACCEPTED_ENCODINGS`.

    Raises:
        httpx.DecodingError: another one (the request accepted none other).
    """
    value = ",".join(v.decode("latin-1") for k, v in response.headers if k == b"content-encoding")
    codings = [
        c.strip().lower() for c in value.split(",") if c.strip().lower() not in ("", "identity")
    ]
    if not codings:
        return ""
    if len(codings) == 1 and codings[0] in _WBITS:
        return codings[0]
    raise httpx.DecodingError(
        f"{what} is {', '.join(codings)}-encoded: expected identity, gzip or deflate (the "
        f"encodings the request accepts: Accept-Encoding: {ACCEPTED_ENCODINGS})"
    )


class Target:
    """Where requests go: a URL parsed once for all of them (its origin, the request target and
    the ``Host`` header).

    Example:
        >>> t = Target("http://127.0.0.1:8000/v1/chat/completions")
        >>> t.origin, t.path, t.host
        ((b'http', b'127.0.0.1', 8000), b'/v1/chat/completions', b'127.0.0.1:8000')
        >>> Target("ftp://host/x")
        Traceback (most recent call last):
        ...
        ValueError: expected an http:// or https:// URL, got 'ftp://host/x'
    """

    __slots__ = ("host", "origin", "path", "url")

    def __init__(self, url: str) -> None:
        parsed = httpx.URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.raw_host:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        self.url = url
        self.origin: Origin = (parsed.raw_scheme, parsed.raw_host, port)
        self.path: bytes = parsed.raw_path
        self.host: bytes = parsed.netloc


def encode_headers(headers: Mapping[str, str], what: str = "headers") -> list[tuple[bytes, bytes]]:
    """``headers`` as sent, checked once (h11's rules: names are tokens, values hold no CR, LF
    or NUL), so that requests can be written without checking them again.

    Example:
        >>> encode_headers({"Authorization": "Bearer sk"})
        [(b'Authorization', b'Bearer sk')]
        >>> encode_headers({"X-Id": "a\\r\\nb"})
        Traceback (most recent call last):
        ...
        ValueError: headers: 'X-Id': expected a header value without CR, LF or NUL, got 'a\\r\\nb'

    Raises:
        ValueError: a name or value that cannot be sent.
    """
    out = []
    for name, value in headers.items():
        try:
            raw = (name.encode("ascii"), value.encode("latin-1"))
            h11.Request(method="GET", target="/", headers=[(b"host", b"h"), raw])
        except (UnicodeEncodeError, h11.LocalProtocolError) as e:
            shown = "a header value without CR, LF or NUL"
            if not isinstance(e, h11.LocalProtocolError) or "name" in str(e).lower():
                shown = "an ASCII token as its name and a Latin-1 value"
            raise ValueError(f"{what}: {name!r}: expected {shown}, got {value!r}") from None
        out.append(raw)
    return out


@dataclass(frozen=True)
class Reply:
    """An answer read whole: its status, its headers (lower-case names; repeated ones joined by
    ``", "``) and its body (inflated, if it was encoded).

    Example:
        >>> r = Reply(200, "OK", {"content-type": "application/json"}, b'{"id": 1}')
        >>> r.json(), r.text
        ({'id': 1}, '{"id": 1}')
    """

    status_code: int
    reason_phrase: str
    headers: Mapping[str, str]
    content: bytes

    @property
    def text(self) -> str:
        """The body decoded by its declared charset (else UTF-8), undecodable bytes replaced."""
        charset = "utf-8"
        for param in self.headers.get("content-type", "").split(";")[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "charset":
                charset = value.strip().strip('"') or charset
        try:
            return self.content.decode(charset, errors="replace")
        except LookupError:  # a charset Python does not know
            return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON.

        Raises:
            ValueError: it is not JSON.
        """
        return json.loads(self.content)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: what the socket received, and one request at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, open_: set[_Connection]) -> None:
        self.loop = loop
        self.open = open_
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

    async def exchange(
        self, request: bytes, method: bytes, closes: bool, what: str, cap: int, setting: str
    ) -> Reply:
        """Send ``request`` (a ``method`` request's bytes; ``closes``: it says
        ``Connection: close``), read the whole answer (its body within ``cap`` bytes, see
        :class:`_Body`); the connection is closed on any error (cancellation included) and
        when the exchange leaves it unusable."""
        assert self.transport is not None
        reader = ResponseReader(method, closes)
        try:
            self.transport.write(request)
            head, content, inflated = await self._answer(reader, what, cap, setting)
        except BaseException as e:
            self.close()
            if isinstance(e, ProtocolError):
                raise httpx.RemoteProtocolError(str(e)) from e
            raise
        if reader.reusable:
            self.idle_since = time.monotonic()
        else:
            self.close()
        headers: dict[str, str] = {}
        for k, v in head.headers:
            name = k.decode("latin-1")
            if not (inflated and name == "content-encoding"):  # the body is inflated
                value = v.decode("latin-1")
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return Reply(head.status, head.reason, headers, content)

    async def _answer(
        self, reader: ResponseReader, what: str, cap: int, setting: str
    ) -> tuple[Head, bytes, bool]:
        """The answer's head and its body (inflated: then True), read as it arrives."""
        head: Head | None = None
        body: _Body | None = None
        while True:
            event = reader.next_event()
            if event is NEED_DATA:
                data = await self._receive()
                if data:
                    reader.feed(data)
                else:
                    reader.feed_eof()
            elif isinstance(event, Head):
                head, body = event, _Body(_encoding(event, what), cap, what, setting)
                if reader.length is not None and reader.length > cap:
                    raise body.too_large(f"(its Content-Length: {reader.length})")
            elif isinstance(event, bytes):
                assert body is not None  # the head comes first
                body.feed(event)
            elif event is END:
                assert head is not None and body is not None
                return head, body.finish(), bool(body.encoding)

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


class Transport:
    """Keep-alive HTTP/1.1 connections of one event loop: one per request in flight, the idle
    ones reused (the last one first), at most ``keep`` of them kept for at most ``expiry``
    seconds.

    Args:
        keep: idle connections kept per origin (None: all).
        expiry: seconds an idle connection is reused for (None: no limit).
        verify: TLS verification, as ``httpx.create_ssl_context`` takes it.
        max_answer_bytes: an answer's largest body, as received and inflated (a larger one
            raises :class:`AnswerTooLarge`); requests accept gzip and deflate only.
        setting: the name of that cap in :class:`AnswerTooLarge`'s message (the key to raise).
    """

    def __init__(
        self,
        keep: int | None = None,
        expiry: float | None = 5.0,
        verify: Any = True,
        *,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        setting: str = "max_answer_bytes",
    ) -> None:
        self.max_answer_bytes = max_answer_bytes
        self.setting = setting
        self.keep = keep
        self.expiry = expiry
        self.verify = verify
        self.idle: dict[Origin, list[_Connection]] = {}
        self.open: set[_Connection] = set()
        self.is_closed = False
        self._ssl: ssl.SSLContext | None = None

    async def request(
        self, target: Target, method: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Reply:
        """``method`` ``target`` with ``headers`` (checked: :func:`encode_headers`) and ``body``:
        the whole answer. ``Host``, ``Content-Length`` and ``Accept-Encoding`` are added.

        Raises:
            RuntimeError: the transport is closed.
            httpx.TransportError: no answer (``ConnectError``, ``ReadError``,
                ``RemoteProtocolError``) or one that does not inflate (``DecodingError``).
            AnswerTooLarge: an answer over the cap.
        """
        if self.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        sized = [(b"Content-Length", str(len(body)).encode())] if body or method == b"POST" else []
        head = [(b"Host", target.host), *headers, *sized, (b"Accept-Encoding", _ACCEPTED)]
        data = request_bytes(method, target.path, head, body)
        idle = self.idle.setdefault(target.origin, [])
        while idle:
            conn = idle.pop()
            if conn.reusable(self.expiry):
                break
            conn.close()
        else:
            conn = await self._connect(target.origin)
        what = f"the answer to {method.decode('ascii')} {target.url}"
        closes = _asks_to_close(headers)
        reply = await conn.exchange(data, method, closes, what, self.max_answer_bytes, self.setting)
        if conn.transport is not None and not conn.transport.is_closing():
            if not self.is_closed and (self.keep is None or len(idle) < self.keep):
                idle.append(conn)
            else:
                conn.close()
        return reply

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
        """Close every connection; later requests raise ``RuntimeError``."""
        self.is_closed = True
        for conn in list(self.open):
            conn.close()
        self.idle.clear()


_ACCEPTED = ACCEPTED_ENCODINGS.encode("ascii")


def _asks_to_close(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether the request's own headers hold ``Connection: close``."""
    return any(
        name.lower() == b"connection" and b"close" in value.lower() for name, value in headers
    )
