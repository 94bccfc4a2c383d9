"""An ``httpx`` transport that enforces a total deadline per request.

httpx's timeouts bound each phase, so a server drip-feeding its answer can keep a request alive
for minutes. Here every socket operation's timeout is cut to the time left before the deadline
:func:`deadline` sets (per thread), so nothing outlives it.

Example:
    >>> import httpx
    >>> client = httpx.Client(transport=DeadlineTransport())
    >>> with deadline(0.5):
    ...     try:
    ...         client.get("http://127.0.0.1:9/")  # nothing listens on port 9
    ...     except httpx.ConnectError:
    ...         print("refused")
    refused
    >>> client.close()
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx

__all__ = ["DeadlineTransport", "deadline"]

_LOCAL = threading.local()


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Requests of this thread made inside the block end within ``seconds`` in total."""
    previous = getattr(_LOCAL, "deadline", None)
    _LOCAL.deadline = time.monotonic() + seconds
    try:
        yield
    finally:
        _LOCAL.deadline = previous


def _left(timeout: float | None, exc: type[Exception]) -> float | None:
    """``timeout`` cut to the time left before this thread's deadline (raises ``exc`` when
    the deadline has passed)."""
    end = getattr(_LOCAL, "deadline", None)
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise exc("the request's total deadline passed")
    return left if timeout is None else min(timeout, left)


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:  # fmt: skip
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self.inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self.inner = httpcore.SyncBackend()

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None, socket_options: Any = None,
    ) -> httpcore.NetworkStream:  # fmt: skip
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self.inner.connect_tcp(host, port, left, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self.inner.connect_unix_socket(path, left, socket_options))

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


# httpcore's exceptions as httpx's, most specific first (what httpx's own transport does).
_MAP: list[tuple[type[Exception], type[Exception]]] = [
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
]


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    try:
        yield
    except Exception as e:
        for core, mapped in _MAP:
            if isinstance(e, core):
                raise mapped(str(e)) from e
        raise


class _Body(httpx.SyncByteStream):
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[bytes]:
        with _mapped():
            yield from self.inner

    def close(self) -> None:
        if hasattr(self.inner, "close"):
            self.inner.close()


class DeadlineTransport(httpx.BaseTransport):
    """HTTP/1.1 over a keep-alive connection pool whose sockets honour :func:`deadline`.

    Args:
        limits: connection limits (as ``httpx.Limits``).
        verify: TLS verification, as ``httpx`` takes it.
    """

    def __init__(self, limits: httpx.Limits | None = None, verify: Any = True) -> None:
        limits = limits or httpx.Limits()
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_Backend(),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _mapped():
            resp = self._pool.handle_request(core)
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_Body(resp.stream),
            extensions=resp.extensions,
        )

    def close(self) -> None:
        self._pool.close()
