"""A lean HTTP/1.1 client: keep-alive connections per host (TLS through the event loop's own
SSL, certificates verified), requests written as one buffer, replies parsed by httptools
(llhttp, the parser uvicorn uses).

Why not aiohttp here: a rollout turn is two small requests to our own services (SGLang's
/generate and the tool server's /tool), and aiohttp spends ~0.12-0.15 ms of CPU on each (a
task per request body, per-request URL, header and timeout objects; profiled with py-spy in
benchmarks/rollout_driver.py): about half of a turn's CPU; on a tool-server cache miss the
call to Serper was ~25 % of the server's CPU. This client does what `Upstream`'s calls need and
nothing else: no proxies (aiohttp ran with trust_env off too), cookies, redirects or
compression (it asks for `identity`; a compressed reply anyway is refused). `Upstream` keeps
its retries, deadlines, caps and error words, and sends what this client does not take (query
parameters, absolute URLs, a pinned TLS name: SerpAPI and the direct reader) through aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy


class PlainHttpError(ConnectionError):
    """The connection failed or the server broke HTTP; `Upstream` retries it as a transport
    failure. `words` say what happened in plain language."""

    def __init__(self, words: str) -> None:
        super().__init__(words)
        self.words = words


class ResponseTooLarge(Exception):
    """The reply's body passed the caller's byte cap (the connection is dropped)."""


@dataclass(frozen=True)
class PlainReply:
    status: int
    headers: Mapping[str, str]
    content: bytes
    charset: str | None


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        # the parser calls back into this object: a cycle, broken in connection_lost so that a
        # closed connection (and the reply it read) is freed at once, not by a later collection
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[PlainReply] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0
        self._limit = 0
        self._answered = False  # a byte of the reply has arrived (not safe to resend)
        self._headers_done = False
        self._overflow = False
        self.keep_alive = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._answered = True
        if self._parser is None:  # after connection_lost: nothing is read any more
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(PlainHttpError("the server sent a malformed response"))
        if self._overflow:
            self._fail(ResponseTooLarge())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done() and self._ends_at_close():
            self.on_message_complete()  # a body without a length ends with the connection
        if self._waiter is not None and not self._waiter.done():
            words = (
                "the connection closed before the response was complete"
                if self._answered
                else "the server closed the connection"
            )
            self._waiter.set_exception(PlainHttpError(words))
        # Measured: a server that closes every connection (Jina's reader behind a proxy, say)
        # left one cycle per page, each holding that page's body, until the collector's next
        # full pass: 170-310 MB more at 1,000 pages with the services' larger GC thresholds.
        self._parser = None
        self.transport = None
        self._waiter = None
        self._headers, self._body = [], []

    def _ends_at_close(self) -> bool:
        """Whether the reply's head is in and says neither a length nor chunks: then its body
        runs until the server closes (RFC 9112 6.3, rule 8), which httptools cannot see."""
        if not self._headers_done:
            return False
        framing = {name.lower() for name, _ in self._headers}
        return b"content-length" not in framing and b"transfer-encoding" not in framing

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        # (httptools turns an exception raised here into a parser error: flag it instead)
        self._size += len(body)
        if self._size > self._limit:
            self._overflow = True
            self._body.clear()
        elif not self._overflow:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if self._overflow:
            return  # data_received fails the request
        encoding = next((v for k, v in self._headers if k.lower() == b"content-encoding"), None)
        if encoding is not None and encoding.strip().lower() not in (b"identity", b""):
            self._fail(PlainHttpError("the server sent a compressed response (none was asked for)"))
            return
        assert self._parser is not None  # it is calling this
        self.keep_alive = self._parser.should_keep_alive()
        headers: CIMultiDict[str] = CIMultiDict(
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in self._headers
        )
        reply = PlainReply(
            self._parser.get_status_code(),
            CIMultiDictProxy(headers),
            b"".join(self._body),
            _charset(headers.get("content-type")),
        )
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(reply)
        # the caller holds the reply: an idle connection in the pool keeps none of it
        self._waiter = None
        self._headers, self._body = [], []

    # the client's side
    def send(self, request: bytes, limit: int, timeout_s: float) -> asyncio.Future[PlainReply]:
        """Write the request; the future holds the reply, or TimeoutError after `timeout_s` (one
        timer on the loop: asyncio.timeout's context cost more than the rest of the call)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[PlainReply] = loop.create_future()
        if self.transport is None:  # lost before this request was written: nothing was sent
            waiter.set_exception(PlainHttpError("the server closed the connection"))
            return waiter
        self._waiter = waiter
        self._headers, self._body, self._size, self._limit = [], [], 0, limit
        self._answered = self._overflow = self._headers_done = False
        timer = loop.call_later(timeout_s, self._fail, TimeoutError())
        waiter.add_done_callback(lambda _: timer.cancel())
        self.transport.write(request)
        return waiter

    @property
    def answered(self) -> bool:
        return self._answered

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, exc: BaseException) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()


def _charset(content_type: str | None) -> str | None:
    if not content_type:
        return None
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return None


class PlainHttpPool:
    """Keep-alive connections to one `http://host:port`, reused last in, first out."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s):// base URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        # certificates and host names verified, as aiohttp's default context does
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        host_header = parts.netloc.rpartition("@")[2]
        lines = [f"Host: {host_header}", "Accept-Encoding: identity"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self._fixed = "".join(f"{line}\r\n" for line in lines).encode("latin-1")
        self._idle: list[_Connection] = []

    async def request(
        self,
        method: str,
        target: str,
        body: bytes,
        headers: Mapping[str, str] | None,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        limit: int,
    ) -> PlainReply:
        """Send one request and read its reply, all within `timeout_s` (a new connection's
        connect within `connect_timeout_s` of it). `target` is the path and query. Raises
        `PlainHttpError` (transport), `ResponseTooLarge` or TimeoutError."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s

        def left() -> float:
            return max(0.001, deadline - loop.time())

        head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        if headers:
            head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode("latin-1")
        request = head + f"Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body
        while self._idle:
            connection = self._idle.pop()
            if connection.closed:
                continue
            try:
                return await self._exchange(connection, request, limit, left())
            except PlainHttpError:
                if connection.answered:
                    raise
                # The server had closed this idle connection before our request reached it
                # (its keep-alive timeout): nothing was processed, so a fresh one may resend.
        connection = await self._connect(min(connect_timeout_s, left()))
        return await self._exchange(connection, request, limit, left())

    async def _connect(self, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                if self._tls is None:
                    _, protocol = await loop.create_connection(_Connection, self.host, self.port)
                else:
                    _, protocol = await loop.create_connection(
                        _Connection, self.host, self.port, ssl=self._tls, server_hostname=self.host
                    )
        except ssl.SSLCertVerificationError:
            raise PlainHttpError("could not connect (the TLS certificate was refused)") from None
        except ssl.SSLError:
            raise PlainHttpError("could not connect (the TLS handshake failed)") from None
        except OSError:  # refused, unreachable, no such host: the words aiohttp's client gave
            raise PlainHttpError("could not connect") from None
        return protocol

    async def _exchange(
        self, connection: _Connection, request: bytes, limit: int, timeout_s: float
    ) -> PlainReply:
        try:
            reply = await connection.send(request, limit, timeout_s)
        except BaseException:
            connection.close()  # cancelled, timed out or failed mid-exchange: never reused
            raise
        if connection.keep_alive and not connection.closed:
            self._idle.append(connection)
        else:
            connection.close()
        return reply

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
