"""The gateway's settings (``python -m agent_memory.gateway --help`` names each flag), checked
once at start-up: an address beyond loopback needs a token, every bound is a positive int.

Example:
    >>> GatewaySettings("http://127.0.0.1:8000/v1", "runs/gw").host
    '127.0.0.1'
    >>> GatewaySettings("http://127.0.0.1:8000/v1", "runs/gw", host="0.0.0.0")
    Traceback (most recent call last):
    ...
    ValueError: host='0.0.0.0' is not loopback: anyone who reaches it could spend the upstream \
and write into the session directory: pass --token <secret> (clients then send \
'Authorization: Bearer <secret>'), or --host 127.0.0.1
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from agent_memory.checks import check_int
from agent_memory.policies.openai_transport import Target

__all__ = ["GatewaySettings", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost`` or a loopback address).

    Example:
        >>> is_loopback("localhost"), is_loopback("::1"), is_loopback("10.0.0.2")
        (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class GatewaySettings:
    """What the gateway serves and records.

    Attributes:
        upstream: the OpenAI-compatible server's base URL (e.g. vLLM's ``http://h:8000/v1``).
        session_dir: where each session's calls are appended (one JSONL file per session).
        host, port: where the gateway listens (port 0: any free one).
        token: the bearer token clients must send (required beyond loopback).
        max_sessions: sessions open at once (not ended): a new one beyond gets 429.
        max_in_flight: chat calls in flight at once: one beyond gets 429.
        max_body_bytes: a request body's largest size: a larger one gets 413.
        upstream_timeout_s: seconds one upstream call may take (a stream: seconds its head,
            and then each of its reads, may take).
        fsync: fsync each record line (durable across a machine crash, not only a process one).
        tokenizer: the served model's tokenizer (a directory or a cached hub id): each call's
            ids are checked to decode to the answer (a mismatch is recorded and counted).
    """

    upstream: str
    session_dir: str
    host: str = "127.0.0.1"
    port: int = 8100
    token: str | None = None
    max_sessions: int = 1024
    max_in_flight: int = 64
    max_body_bytes: int = 8 * 2**20
    upstream_timeout_s: float = 600.0
    fsync: bool = True
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        try:
            Target(self.upstream.rstrip("/") + "/chat/completions")
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"upstream must be an http(s) base URL like 'http://127.0.0.1:8000/v1', "
                f"got {self.upstream!r} ({e})"
            ) from None
        if not is_loopback(self.host) and not self.token:
            raise ValueError(
                f"host={self.host!r} is not loopback: anyone who reaches it could spend the "
                "upstream and write into the session directory: pass --token <secret> "
                "(clients then send 'Authorization: Bearer <secret>'), or --host 127.0.0.1"
            )
        check_int("port", self.port, 0)
        for name in ("max_sessions", "max_in_flight", "max_body_bytes"):
            check_int(name, getattr(self, name), 1)
        if not self.upstream_timeout_s > 0:
            raise ValueError(
                f"upstream_timeout_s must be a number of seconds > 0, got {self.upstream_timeout_s}"
            )
