"""Helpers of the mock-server tests: an HTTP client on urllib, the tiny model's vocabulary."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

_TEXT = (
    "you see a box and a door . the key is at the wall ; go up down left right take open "
    "push pull look north south east west red blue green one two three Legend : # _ O X P"
)
WORDS = _TEXT.split(" ")


def call(url: str, body: Any = None, method: str | None = None) -> tuple[int, Any]:
    """``(status, JSON)`` of one request (POST when there is a body)."""
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
