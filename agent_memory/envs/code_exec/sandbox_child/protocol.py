"""Frames: a 4-byte big-endian length and a UTF-8 JSON object, in both directions.

Bound at import so that user code rebinding ``json.dumps`` or ``os.write`` in the runner cannot
break the runner's side of the protocol (it could only break its own run).

Example:
    >>> r, w = os.pipe()
    >>> send(w, {"op": "ready"}); os.close(w)
    >>> recv(r), recv(r)
    ({'op': 'ready'}, None)
"""

from __future__ import annotations

import json
import os

_dumps, _loads, _read, _write = json.dumps, json.loads, os.read, os.write
HEADER = 4
MAX_NAMES = 200  # names reported per run
MAX_NAME = 200  # characters per name and per type name


class Malformed(Exception):
    """The bytes on the pipe are not a frame (too long, not JSON, not an object)."""


def _read_exact(fd: int, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = _read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def recv(fd: int, max_size: int = 64 * 2**20) -> dict | None:
    """One frame from ``fd``; None at EOF (the other side is gone).

    Raises:
        Malformed: the length is over ``max_size`` or the body is not a JSON object.
    """
    header = _read_exact(fd, HEADER)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > max_size:
        raise Malformed(f"a frame of {size} bytes (at most {max_size})")
    body = _read_exact(fd, size)
    if body is None:
        return None
    try:
        msg = _loads(body)
    except ValueError:
        raise Malformed("a frame that is not JSON") from None
    if not isinstance(msg, dict):
        raise Malformed(f"a frame holding a {type(msg).__name__}, not an object")
    return msg


def recv_or_none(fd: int, max_size: int = 64 * 2**20) -> dict | None:
    """:func:`recv`, but None also for a broken pipe or a malformed frame."""
    try:
        return recv(fd, max_size)
    except (OSError, Malformed):
        return None


def send(fd: int, obj: dict) -> None:
    """Write one frame (blocking: the reader is always waiting while we answer)."""
    body = _dumps(obj).encode("utf-8")
    data = memoryview(len(body).to_bytes(HEADER, "big") + body)
    while data:
        data = data[_write(fd, data) :]


def max_result_size(cap: int) -> int:
    """The largest honest result frame for output caps of ``cap`` characters (JSON may escape a
    character into 12 bytes: a surrogate pair)."""
    return 4096 + 12 * (2 * cap + 2 * MAX_NAMES * MAX_NAME)


def clean_result(msg: dict, seq: int, cap: int) -> dict | None:
    """A fresh, well-typed copy of a result frame for run ``seq``, or None if it is not one.

    Example:
        >>> clean_result({"op": "result", "seq": 3, "status": "ok", "head": "hi", "tail": "",
        ...               "omitted": 0, "names": [["x", "int"]]}, seq=3, cap=10)["names"]
        [['x', 'int']]
        >>> clean_result({"op": "result", "seq": 2}, seq=3, cap=10) is None
        True
    """
    if msg.get("op") != "result" or type(msg.get("seq")) is not int or msg["seq"] != seq:
        return None
    status, head, tail, omitted = (msg.get(k) for k in ("status", "head", "tail", "omitted"))
    names = msg.get("names")
    if status not in ("ok", "error") or type(head) is not str or type(tail) is not str:
        return None
    if type(omitted) is not int or omitted < 0 or type(names) is not list:
        return None
    if len(names) > MAX_NAMES or not all(
        type(pair) is list
        and len(pair) == 2
        and all(type(x) is str and len(x) <= MAX_NAME for x in pair)
        for pair in names
    ):
        return None
    omitted += max(0, len(head) - cap) + max(0, len(tail) - cap)
    return {
        "op": "result",
        "seq": seq,
        "status": status,
        "head": head[:cap],
        "tail": tail[-cap:] if cap else "",
        "omitted": omitted,
        "names": [[str(a), str(b)] for a, b in names],
    }
