"""The openai client's HTTP/1.1 reader (``policies/http1.py``): each way an answer's body is
delimited, fed whole and a byte at a time, read as h11 reads it; and the answers it refuses,
each with its message."""

from __future__ import annotations

import re

import h11
import pytest

from agent_memory.policies.http1 import (
    END,
    MAX_HEAD_BYTES,
    NEED_DATA,
    Head,
    ProtocolError,
    ResponseReader,
    request_bytes,
)

CL = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"a": true}'
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'4;ext=1\r\n{"a"\r\n7\r\n: true}\r\n0\r\nX-Trailer: 1\r\n\r\n'
)
CLOSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end"
#: Valid answers (method, bytes, ended by the close, reusable after).
VALID = {
    "content-length": (b"POST", CL, False, True),
    "chunked": (b"POST", CHUNKED, False, True),
    "close-delimited": (b"POST", CLOSE, True, False),
    "empty": (b"POST", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False, True),
    "no-content": (b"POST", b"HTTP/1.1 204 No Content\r\n\r\n", False, True),
    "head": (b"HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", False, True),
    "continue-first": (b"POST", b"HTTP/1.1 100 Continue\r\n\r\n" + CL, False, True),
    "http/1.0": (b"POST", CL.replace(b"HTTP/1.1", b"HTTP/1.0"), False, False),
    "connection-close": (
        b"POST",
        CL.replace(b"\r\n\r\n", b"\r\nConnection: keep-alive, close\r\n\r\n"),
        False,
        False,
    ),
    "bare-lf": (b"POST", CL.replace(b"\r\n", b"\n"), False, True),
    "lengths-repeated": (
        b"POST",
        CL.replace(b"\r\n\r\n", b"\r\nContent-Length: 11, 11\r\n\r\n"),
        False,
        True,
    ),
    "empty-reason": (b"POST", b"HTTP/1.1 200 \r\nContent-Length: 1\r\n\r\nx", False, True),
    "no-reason": (b"POST", b"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx", False, True),
}


def _read(method: bytes, pieces: list[bytes], eof: bool) -> tuple[Head, bytes, ResponseReader]:
    reader = ResponseReader(method)
    head, body, pieces = None, b"", list(pieces)
    while True:
        event = reader.next_event()
        if event is NEED_DATA:
            if pieces:
                reader.feed(pieces.pop(0))
            else:
                assert eof, "the reader wants more than the whole answer"
                reader.feed_eof()
        elif isinstance(event, Head):
            assert head is None
            head = event
        elif isinstance(event, bytes):
            assert head is not None
            body += event
        else:
            assert event is END and head is not None
            assert reader.next_event() is END  # it stays ended
            return head, body, reader


def _h11(
    method: bytes, data: bytes, eof: bool
) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
    conn = h11.Connection(h11.CLIENT)
    conn.send(
        h11.Request(method=method, target="/", headers=[("Host", "h"), ("Content-Length", "0")])
    )
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    if eof:
        conn.receive_data(b"")
    body, response = b"", None
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert response is not None
            return response.status_code, response.reason, list(response.headers), body


@pytest.mark.parametrize("case", sorted(VALID))
@pytest.mark.parametrize("split", ["whole", "bytewise"])
def test_an_answer_is_read_as_h11_reads_it(case, split):
    method, data, eof, reusable = VALID[case]
    pieces = [data] if split == "whole" else [data[i : i + 1] for i in range(len(data))]
    head, body, reader = _read(method, pieces, eof)
    status, reason, headers, h11_body = _h11(method, data, eof)
    assert (head.status, head.reason.encode(), body) == (status, reason, h11_body)
    # (h11 folds repeated Content-Length values into one field: the body shows they are read.)
    unframed = [(k, v) for k, v in head.headers if k != b"content-length"]
    assert unframed == [(k, v) for k, v in headers if k != b"content-length"]
    assert reader.reusable is reusable


def test_a_request_is_what_h11_would_send():
    headers = [(b"Host", b"127.0.0.1:8000"), (b"Content-Length", b"2")]
    conn = h11.Connection(h11.CLIENT)
    sent = conn.send(h11.Request(method=b"POST", target=b"/v1/x", headers=headers))
    sent += conn.send(h11.Data(data=b"{}")) + conn.send(h11.EndOfMessage())
    assert request_bytes(b"POST", b"/v1/x", headers, b"{}") == sent


def test_a_request_that_asks_to_close_leaves_its_connection_unused():
    reader = ResponseReader(b"POST", request_closes=True)
    reader.feed(CL)
    while reader.next_event() is not END:
        pass
    assert not reader.reusable


def test_bytes_beyond_the_answer_leave_its_connection_unused():
    _, body, reader = _read(b"POST", [CL + b"HTTP/1.1 200 OK\r\n"], eof=False)
    assert body == b'{"a": true}' and not reader.reusable


def test_a_folded_header_value_is_joined_by_a_space():
    data = b"HTTP/1.1 200 OK\r\nX-Long: a\r\n  b\r\nContent-Length: 0\r\n\r\n"
    head, _, _ = _read(b"POST", [data], eof=False)
    assert head.headers[0] == (b"x-long", b"a b")


@pytest.mark.parametrize(
    "data, eof, message",
    [
        (b"", True, "Server disconnected without sending a response."),
        (
            b"HTTP/1.1 200 OK\r\nContent-",
            True,
            "the server closed the connection within the answer's head",
        ),
        (
            CL[:-3],
            True,
            "peer closed connection without sending complete message body: received 8 bytes, expected 11",
        ),
        (
            CHUNKED[:-12],
            True,
            "peer closed connection without sending complete message body: incomplete chunked read (received 11 bytes)",
        ),
        (
            b"HTTP/2 200\r\n\r\n",
            False,
            "expected an HTTP/1.1 status line (e.g. 'HTTP/1.1 200 OK'), got b'HTTP/2 200'",
        ),
        (b"HTTP/2.0 200 OK\r\n\r\n", False, "expected an answer over HTTP/1.x, got HTTP/2.0"),
        (
            b"<html>\r\n\r\n",
            False,
            "expected an HTTP/1.1 status line (e.g. 'HTTP/1.1 200 OK'), got b'<html>'",
        ),
        (
            b"HTTP/1.1 200 OK\r\nBad Name: 1\r\n\r\n",
            False,
            "expected a header field 'name: value' (a token, then visible characters), got b'Bad Name: 1'",
        ),
        (
            b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n\r\n",
            False,
            "expected a header field 'name: value' (a token, then visible characters), got b'X: a\\x00b'",
        ),
        (
            b"HTTP/1.1 200 OK\r\n folded\r\n\r\n",
            False,
            "the answer's first header field starts with whitespace",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
            False,
            "the answer's Content-Length is 1, 2: expected one non-negative integer",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            False,
            "the answer's Content-Length is -1: expected one non-negative integer",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            False,
            "the answer's Transfer-Encoding is gzip, chunked: expected chunked (the only transfer coding this client reads)",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 11\r\n\r\n",
            False,
            "the answer has both Transfer-Encoding and Content-Length: expected one of them (RFC 9112, section 6.3: such a message is an error)",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nTransfer-Encoding: chunked\r\n\r\n",
            False,
            "the answer has both Transfer-Encoding and Content-Length",
        ),
        # A field counts by its presence (RFC 9112, section 6.3): an empty Content-Length is
        # invalid (not a close-delimited body), and beside Transfer-Encoding it is both fields.
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\nbody",
            False,
            "the answer's Content-Length is empty: expected one non-negative integer",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length:\r\n\r\n",
            False,
            "the answer has both Transfer-Encoding and Content-Length: expected one of them",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: \r\nContent-Length: 2\r\n\r\nok",
            False,
            "the answer has both Transfer-Encoding and Content-Length: expected one of them",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: \r\n\r\nok",
            False,
            "the answer's Transfer-Encoding is empty: expected chunked",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            False,
            "expected a chunk size (hexadecimal digits), got b'zz'",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokxx",
            False,
            "expected CRLF after a chunk's data, got b'xx'",
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
            False,
            "the server switched protocols (101): expected an answer over HTTP/1.1",
        ),
        (
            b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * MAX_HEAD_BYTES,
            False,
            f"the answer's head is over {MAX_HEAD_BYTES} bytes without its end",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * (MAX_HEAD_BYTES + 1),
            False,
            f"a line of the answer's chunked body is over {MAX_HEAD_BYTES} bytes",
        ),
    ],
)
def test_an_answer_that_breaks_http_is_refused_with_what_was_expected(data, eof, message):
    reader = ResponseReader(b"POST")
    reader.feed(data)
    if eof:
        reader.feed_eof()
    with pytest.raises(ProtocolError, match=re.escape(message)):
        while reader.next_event() not in (NEED_DATA, END):
            pass
