"""HTTP/1.1 for the openai policy's client, without I/O: a request's bytes, and a reader that
frames one answer from the bytes its connection receives (RFC 9112: the status line, the header
fields, then a body delimited by ``Transfer-Encoding: chunked``, ``Content-Length`` or the
connection's close), in a few passes over the bytes (why not h11: docs/benchmarks.md).

Example:
    >>> reader = ResponseReader(b"POST")
    >>> reader.feed(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
    >>> head = reader.next_event()
    >>> head.status, head.reason, head.headers
    (200, 'OK', [(b'content-length', b'2')])
    >>> reader.next_event(), reader.next_event() is END, reader.reusable
    (b'ok', True, True)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "END",
    "MAX_HEAD_BYTES",
    "NEED_DATA",
    "Head",
    "ProtocolError",
    "ResponseReader",
    "request_bytes",
]

#: The most bytes an answer's head (or a chunk's size line, or its trailers) may take before
#: its end shows (h11's default): a server that never ends its head cannot grow the buffer.
MAX_HEAD_BYTES = 16 * 1024


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: :meth:`ResponseReader.next_event`: more bytes are needed (or the end of the stream).
NEED_DATA: Final = _Marker("NEED_DATA")
#: :meth:`ResponseReader.next_event`: the answer is complete.
END: Final = _Marker("END")


class ProtocolError(Exception):
    """An answer that is not HTTP/1.1, or that the server broke off."""


@dataclass(frozen=True)
class Head:
    """An answer's status line and header fields (names lower-cased, values without the
    whitespace around them, in the order sent)."""

    status: int
    reason: str
    headers: list[tuple[bytes, bytes]]
    http_version: bytes

    def get(self, name: bytes) -> list[bytes]:
        """The values of header ``name`` (lower-case), comma-separated lists split."""
        return [
            v.strip(b" \t")
            for k, value in self.headers
            if k == name
            for v in value.split(b",")
            if v.strip(b" \t")
        ]


def request_bytes(
    method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """A request as sent: request line, ``headers`` (checked before: see
    :func:`~agent_memory.policies.openai_transport.encode_headers`) and ``body``.

    Example:
        >>> request_bytes(b"POST", b"/v1/x", [(b"Host", b"h"), (b"Content-Length", b"2")], b"{}")
        b'POST /v1/x HTTP/1.1\\r\\nHost: h\\r\\nContent-Length: 2\\r\\n\\r\\n{}'
    """
    parts = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts += (b"\r\n", body)
    return b"".join(parts)


_HEAD_END = re.compile(rb"\r?\n\r?\n")
_STATUS_LINE = re.compile(rb"HTTP/([0-9]\.[0-9]) ([0-9]{3})(?: ([^\x00-\x08\x0a-\x1f\x7f]*))?")
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*(.*?)[ \t]*")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_CHUNK_SIZE = re.compile(rb"[ \t]*([0-9A-Fa-f]{1,16})[ \t]*(?:;.*)?")

_State = Literal["head", "length", "close", "size", "data", "crlf", "trailers", "end"]


class ResponseReader:
    """One answer to a ``method`` request, framed from the bytes :meth:`feed` gives it.

    :meth:`next_event` returns the :class:`Head` (informational 1xx heads are skipped), then
    pieces of the body as ``bytes``, then :data:`END`; :data:`NEED_DATA` while it waits for
    more. After :data:`END`, :attr:`reusable` says whether the connection may carry another
    request (HTTP/1.1, ``Connection: close`` in neither the answer nor the request
    (``request_closes``), a body not ended by the close, nothing sent beyond the answer).

    Example:
        >>> reader = ResponseReader(b"GET")
        >>> reader.feed(b"HTTP/1.1 200 OK\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n")
        >>> reader.feed(b"2\\r\\nok\\r\\n")
        >>> reader.next_event().status, reader.next_event(), reader.next_event()
        (200, b'ok', NEED_DATA)
        >>> reader.feed(b"0\\r\\n\\r\\n")
        >>> reader.next_event()
        END

    Raises:
        ProtocolError: (from :meth:`next_event`) the bytes break HTTP/1.1, or the stream ended
            (:meth:`feed_eof`) before the answer did.
    """

    def __init__(self, method: bytes, request_closes: bool = False) -> None:
        self.method = method
        self.request_closes = request_closes
        self.buffer = bytearray()
        self.eof = False
        self.state: _State = "head"
        self.keep_alive = False
        self.left = 0  # bytes of the body (Content-Length) or of the chunk not yet read
        self.received = 0  # bytes of the body read
        self.length: int | None = None  # the declared Content-Length

    @property
    def reusable(self) -> bool:
        """The answer is complete and its connection may carry the next request."""
        return self.state == "end" and self.keep_alive and not self.buffer

    def feed(self, data: bytes) -> None:
        """Bytes as the connection received them."""
        self.buffer += data

    def feed_eof(self) -> None:
        """The server closed its side: nothing more will come."""
        self.eof = True

    def next_event(self) -> Head | bytes | _Marker:
        """The next part of the answer (see the class docstring)."""
        state = self.state
        if state == "head":
            return self._head()
        if state == "length":
            return self._piece()
        if state == "close":
            if self.buffer:
                return self._take(len(self.buffer))
            if self.eof:
                self.state = "end"
                return END
            return NEED_DATA
        if state == "end":
            return END
        return self._chunked()

    def _head(self) -> Head | _Marker:
        while True:
            found = _HEAD_END.search(self.buffer)
            if found is None:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise ProtocolError(
                        f"the answer's head is over {MAX_HEAD_BYTES} bytes without its end: "
                        "expected a status line and header fields that end with an empty line"
                    )
                if self.eof:
                    if not self.buffer:  # (a skipped 1xx answer is no response)
                        raise ProtocolError("Server disconnected without sending a response.")
                    raise ProtocolError("the server closed the connection within the answer's head")
                return NEED_DATA
            raw = bytes(self.buffer[: found.start()])
            del self.buffer[: found.end()]
            head = _parse_head(raw)
            if 100 <= head.status < 200:
                if head.status == 101:
                    raise ProtocolError(
                        "the server switched protocols (101): expected an answer over HTTP/1.1"
                    )
                continue  # informational (e.g. 100 Continue): the answer follows
            self._frame(head)
            return head

    def _frame(self, head: Head) -> None:
        """How the body is delimited (RFC 9112, section 6.3) and whether the connection stays."""
        close = b"close" in (c.lower() for c in head.get(b"connection"))
        self.keep_alive = head.http_version == b"1.1" and not (close or self.request_closes)
        if self.method == b"HEAD" or head.status in (204, 304):
            self.state = "end"
            return
        # A field counts by its presence, an empty value included (RFC 9112, section 6.3).
        names = {name for name, _ in head.headers}
        if b"transfer-encoding" in names and b"content-length" in names:
            # RFC 9112 §6.1: a sender MUST NOT send both; §6.3 (3): such a message "ought to be
            # handled as an error" (request smuggling, response splitting): refused, and the
            # connection closed, never reused for a next request.
            raise ProtocolError(
                "the answer has both Transfer-Encoding and Content-Length: expected one of them "
                "(RFC 9112, section 6.3: such a message is an error)"
            )
        if b"transfer-encoding" in names:
            codings = [c.lower() for c in head.get(b"transfer-encoding")]
            if codings != [b"chunked"]:
                shown = ", ".join(c.decode("latin-1") for c in codings) or "empty"
                raise ProtocolError(
                    f"the answer's Transfer-Encoding is {shown}: expected chunked (the only "
                    "transfer coding this client reads)"
                )
            self.state = "size"
            return
        if b"content-length" in names:
            self.length = self.left = _content_length(head)
            self.state = "length" if self.left else "end"
            return
        self.state, self.keep_alive = "close", False  # the body ends with the connection

    def _take(self, n: int) -> bytes:
        piece = bytes(self.buffer[:n])
        del self.buffer[:n]
        self.received += len(piece)
        return piece

    def _piece(self) -> bytes | _Marker:
        """A piece of a Content-Length body."""
        if not self.buffer:
            if self.eof:
                raise ProtocolError(
                    "peer closed connection without sending complete message body: received "
                    f"{self.received} bytes, expected {self.length}"
                )
            return NEED_DATA
        piece = self._take(min(self.left, len(self.buffer)))
        self.left -= len(piece)
        if not self.left:
            self.state = "end"
        return piece

    def _line(self) -> bytes | None:
        """The next line without its end (None: it has not come whole yet)."""
        end = self.buffer.find(b"\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise ProtocolError(
                    f"a line of the answer's chunked body is over {MAX_HEAD_BYTES} bytes: "
                    "expected a chunk size or a trailer field"
                )
            return None
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 1]
        return line[:-1] if line.endswith(b"\r") else line

    def _chunked(self) -> bytes | _Marker:
        """The next piece of a chunked body (or its end)."""
        while True:
            state = self.state
            if state == "data":
                if not self.buffer:
                    break
                piece = self._take(min(self.left, len(self.buffer)))
                self.left -= len(piece)
                if not self.left:
                    self.state = "crlf"
                return piece
            if state == "crlf":
                if self.buffer[:2] == b"\r\n" or self.buffer[:1] == b"\n":
                    del self.buffer[: 2 if self.buffer[:1] == b"\r" else 1]
                    self.state = "size"
                    continue
                if self.buffer in (b"", b"\r"):
                    break
                raise ProtocolError(
                    f"expected CRLF after a chunk's data, got {bytes(self.buffer[:2])!r}"
                )
            line = self._line()
            if line is None:
                break
            if state == "trailers":
                if not line:
                    self.state = "end"
                    return END
                continue  # a trailer field: nothing the client reads
            size = _CHUNK_SIZE.fullmatch(line)
            if size is None:
                raise ProtocolError(
                    f"expected a chunk size (hexadecimal digits), got {line[:40]!r}"
                )
            self.left = int(size.group(1), 16)
            self.state = "data" if self.left else "trailers"
        if self.eof:
            raise ProtocolError(
                f"peer closed connection without sending complete message body: incomplete "
                f"chunked read (received {self.received} bytes)"
            )
        return NEED_DATA


def _content_length(head: Head) -> int:
    """The answer's declared body length (repeated equal values read as one).

    Raises:
        ProtocolError: no value, values that differ, or one that is not a non-negative integer
            (RFC 9112, section 6.3 (5): an unrecoverable error, an empty value included).
    """
    lengths = set(head.get(b"content-length"))
    if len(lengths) != 1 or not next(iter(lengths)).isdigit():
        shown = ", ".join(v.decode("latin-1") for v in sorted(lengths)) or "empty"
        raise ProtocolError(
            f"the answer's Content-Length is {shown}: expected one non-negative integer"
        )
    return int(lengths.pop())


def _parse_head(raw: bytes) -> Head:
    """A head's status line and fields (``raw`` without the empty line that ends it)."""
    lines = raw.split(b"\n")
    status_line = lines[0].removesuffix(b"\r")
    status = _STATUS_LINE.fullmatch(status_line)
    if status is None:
        raise ProtocolError(
            f"expected an HTTP/1.1 status line (e.g. 'HTTP/1.1 200 OK'), got {status_line[:60]!r}"
        )
    version, code, reason = status.groups()
    if not version.startswith(b"1."):
        raise ProtocolError(f"expected an answer over HTTP/1.x, got HTTP/{version.decode()}")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        line = line.removesuffix(b"\r")
        if line[:1] in (b" ", b"\t"):  # obs-fold: a continuation, read as one space (RFC 9112)
            if not headers:
                raise ProtocolError("the answer's first header field starts with whitespace")
            name, value = headers[-1]
            more = line.strip(b" \t")
            if _BAD_VALUE.search(more):
                raise ProtocolError(
                    f"expected visible characters in a header field, got {line[:60]!r}"
                )
            headers[-1] = (name, (value + b" " + more).strip(b" \t"))
            continue
        field = _FIELD.fullmatch(line)
        if field is None or _BAD_VALUE.search(field.group(2)):
            raise ProtocolError(
                f"expected a header field 'name: value' (a token, then visible characters), "
                f"got {line[:60]!r}"
            )
        headers.append((field.group(1).lower(), field.group(2)))
    return Head(int(code), (reason or b"").decode("latin-1"), headers, version)
