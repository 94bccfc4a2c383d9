"""The openai policy's HTTP client on aiohttp (its C parser, llhttp): the interface of
:class:`~agent_memory.policies.openai_transport.Transport`, its errors and its caps.

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

import ssl
from typing import Any

import aiohttp
import httpx
from multidict import CIMultiDict
from yarl import URL

from agent_memory.policies.openai_protocol import DEFAULT_MAX_ANSWER_BYTES
from agent_memory.policies.openai_transport import (
    _ACCEPTED,
    _WBITS,
    ACCEPTED_ENCODINGS,
    Reply,
    Target,
    _Body,
    _describe,
)

__all__ = ["Transport"]


def _encoding(headers: list[tuple[bytes, bytes]], what: str) -> str:
    """The answer's content encoding: "" (identity), gzip or deflate.

    Raises:
        httpx.DecodingError: another one (the request accepted none other).
    """
    value = ",".join(v.decode("latin-1") for k, v in headers if k.lower() == b"content-encoding")
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


class Transport:
    """Keep-alive HTTP/1.1 connections of one event loop (an ``aiohttp.ClientSession``): at
    most ``keep`` open, idle ones reused for at most ``expiry`` seconds.

    Args:
        keep: connections open at once (None: no limit).
        expiry: seconds an idle connection is reused for (None: aiohttp's default).
        verify: TLS verification, as ``httpx.create_ssl_context`` takes it.
        max_answer_bytes: an answer's largest body, as received and inflated.
        setting: the name of that cap in :class:`AnswerTooLarge`'s message.
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
        self.is_closed = False
        self.session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}
        self._headers: tuple[int, CIMultiDict[str]] | None = None

    def _session(self, scheme: bytes) -> aiohttp.ClientSession:
        if self.session is None:
            tls: ssl.SSLContext | bool = False
            if scheme == b"https":
                tls = httpx.create_ssl_context(verify=self.verify)
            connector = aiohttp.TCPConnector(
                limit=self.keep or 0,
                keepalive_timeout=self.expiry if self.expiry is not None else 15.0,
                ssl=tls,
            )
            self.session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self.session

    def _encode(self, headers: list[tuple[bytes, bytes]]) -> CIMultiDict[str]:
        cached = self._headers
        if cached is not None and cached[0] == id(headers):
            return cached[1]
        out: CIMultiDict[str] = CIMultiDict(
            (k.decode("latin-1"), v.decode("latin-1")) for k, v in headers
        )
        out["Accept-Encoding"] = _ACCEPTED.decode("ascii")
        self._headers = (id(headers), out)
        return out

    async def request(
        self, target: Target, method: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> Reply:
        """``method`` ``target`` with ``headers`` and ``body``: the whole answer.

        Raises:
            RuntimeError: the transport is closed.
            httpx.TransportError: no answer, or one that does not inflate.
            AnswerTooLarge: an answer over the cap.
        """
        if self.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        session = self._session(target.origin[0])
        url = self._urls.get(target.url)
        if url is None:
            url = self._urls[target.url] = URL(target.url)
        what = f"the answer to {method.decode('ascii')} {target.url}"
        try:
            async with session.request(
                method.decode("ascii"),
                url,
                headers=self._encode(headers),
                data=body if body or method == b"POST" else None,
                allow_redirects=False,
            ) as resp:
                try:
                    return await self._read(resp, what)
                except BaseException:
                    resp.close()
                    raise
        except aiohttp.ClientConnectorError as e:
            raise httpx.ConnectError(_describe(e.os_error)) from e
        except aiohttp.ServerDisconnectedError as e:
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response."
            ) from e
        except (aiohttp.ClientResponseError, aiohttp.ClientPayloadError) as e:
            raise httpx.RemoteProtocolError(_protocol(e)) from e
        except aiohttp.ClientOSError as e:
            raise httpx.ReadError(_describe(e)) from e

    async def _read(self, resp: aiohttp.ClientResponse, what: str) -> Reply:
        raw = list(resp.raw_headers)
        body = _Body(_encoding(raw, what), self.max_answer_bytes, what, self.setting)
        length = resp.content_length
        if length is not None and length > self.max_answer_bytes:
            raise body.too_large(f"(its Content-Length: {length})")
        async for piece in resp.content.iter_any():
            body.feed(piece)
        content = body.finish()
        inflated = bool(body.encoding)
        out: dict[str, str] = {}
        for k, v in raw:
            name = k.decode("latin-1").lower()
            if not (inflated and name == "content-encoding"):
                value = v.decode("latin-1")
                out[name] = f"{out[name]}, {value}" if name in out else value
        return Reply(resp.status, resp.reason or "", out, content)

    async def aclose(self) -> None:
        """Close every connection; later requests raise ``RuntimeError``."""
        self.is_closed = True
        if self.session is not None:
            await self.session.close()


def _protocol(e: aiohttp.ClientError) -> str:
    """aiohttp's word on an answer that breaks HTTP/1.1."""
    if isinstance(e, aiohttp.ClientResponseError):
        return f"the answer is not HTTP/1.1 as RFC 9112 frames it: {e.message}"
    return f"the answer's body is broken: {e}"
