"""A lean HTTP/1.1 client for plain `http://` hops inside the cluster: the rollout's calls to
our own services and SGLang. Keep-alive connections per host, requests written as one buffer,
replies parsed by httptools (llhttp, the parser uvicorn uses). Everything that leaves the
cluster (Serper, SerpAPI, Jina, pages, an external judge) goes through aiohttp instead:
`Upstream` uses this client only where its settings ask for it (`plain_http`), and never for
`https://`.

Why own it at all: a rollout turn is two small requests to our own services (SGLang's
/generate and the tool server's /tool), and aiohttp spends ~0.12-0.15 ms of CPU on each (a
task per request body, per-request URL, header and timeout objects; profiled with py-spy in
benchmarks/rollout_driver.py): about half of a turn's CPU (docs/services.md has the figures).
It does what `Upstream`'s calls need and nothing else: no TLS, proxies, cookies, redirects or
compression (it asks for `identity`; a compressed reply anyway is refused).

Framing is never guessed (RFC 9112): interim 1xx replies are skipped, a head over
`MAX_HEAD_BYTES` or `MAX_HEADERS` fields is refused, and any byte the server sends that is not
the reply to the request in flight (a body longer than its Content-Length, a reply nobody
asked for) closes the connection, so it can never answer another caller's request.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from services.base.errors import ServingError

__all__ = [
    "MAX_HEAD_BYTES",
    "PlainHttpError",
    "PlainHttpPool",
    "ResponseTooLarge",
    "check_header",
]

# aiohttp's own limits are 8,190 bytes a line and 32,768 fields; a reply of ours or SGLang's has
# a head of a few hundred bytes. Beyond these the reply is refused, not read further.
MAX_HEAD_BYTES = 65_536
MAX_HEADERS = 128
MAX_INTERIM_REPLIES = 8  # 100 Continue, 103 Early Hints: skipped, but not without end


class PlainHttpError(ServingError):
    """The connection failed or the server broke HTTP; `Upstream` retries it as a transport
    failure. `words` say what happened in plain language."""

    def __init__(self, words: str) -> None:
        super().__init__(words)
        self.words = words


class ResponseTooLarge(ServingError):
    """The reply's body passed the caller's byte cap (the connection is dropped)."""


@dataclass(frozen=True)
class PlainReply:
    status: int
    headers: Mapping[str, str]
    content: bytes
    charset: str | None


class _Connection(asyncio.Protocol):
    """One keep-alive connection: at most one request in flight on it, and no byte read that
    is not that request's reply."""

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
        self._head_bytes = 0  # bytes read while the final reply's head was not yet complete
        self._interim = 0
        self._in_flight = False  # a request was written and its final reply is not yet read
        self._answered = False  # a byte of the reply has arrived (not safe to resend)
        self._headers_done = False
        self._overflow = False
        self._error: BaseException | None = None  # found inside a parser callback
        self.keep_alive = True

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._parser is None:  # after connection_lost: nothing is read any more
            return
        if not self._in_flight:
            # Bytes nobody asked for (a body longer than its length, an unsolicited reply):
            # the framing is in doubt, so the connection ends here and answers no one.
            self._fail(PlainHttpError("the server sent bytes that answer no request"))
            return
        self._answered = True
        head_before = not self._headers_done
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(PlainHttpError("the server switched protocols (none was asked for)"))
        except httptools.HttpParserError:
            if self._error is None:
                self._error = PlainHttpError("the server sent a malformed response")
        if self._error is not None:
            self._fail(self._error)
        elif self._overflow:
            self._fail(ResponseTooLarge("the reply's body passed the caller's byte cap"))
        elif head_before and not self._headers_done and self._in_flight:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._fail(PlainHttpError(f"the server sent a head over {MAX_HEAD_BYTES} bytes"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is not None and not self._waiter.done() and self._ends_at_close():
            self._complete()  # a body without a length ends with the connection
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
        self._in_flight = False
        self._headers, self._body = [], []

    def _ends_at_close(self) -> bool:
        """Whether the reply's head is in and says neither a length nor chunks: then its body
        runs until the server closes (RFC 9112 6.3, rule 8), which httptools cannot see."""
        if not self._headers_done:
            return False
        framing = {name.lower() for name, _ in self._headers}
        return b"content-length" not in framing and b"transfer-encoding" not in framing

    # httptools callbacks (an exception raised in one becomes a parser error: record it instead)
    def on_message_begin(self) -> None:
        if not self._in_flight and self._error is None:
            # a second reply in the same bytes as the first: the first's body was longer than
            # its length said, or the server answers what nobody asked
            self._error = PlainHttpError("the server sent bytes that answer no request")

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self._headers) >= MAX_HEADERS:
            if self._error is None:
                self._error = PlainHttpError(f"the server sent over {MAX_HEADERS} header fields")
            return
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None  # it is calling this
        if not self._is_interim(self._parser.get_status_code()):
            self._headers_done = True

    def on_body(self, body: bytes) -> None:
        if not self._in_flight:
            return  # on_message_begin recorded the error
        self._size += len(body)
        if self._size > self._limit:
            self._overflow = True
            self._body.clear()
        elif not self._overflow:
            self._body.append(body)

    def on_message_complete(self) -> None:
        if not self._in_flight or self._overflow:
            return  # on_message_begin recorded the error; data_received fails an overflow
        assert self._parser is not None  # it is calling this
        if self._is_interim(self._parser.get_status_code()):
            # 100 Continue, 103 Early Hints: not the reply (RFC 9110 15.2); the real one follows
            self._interim += 1
            self._headers = []
            if self._interim > MAX_INTERIM_REPLIES and self._error is None:
                self._error = PlainHttpError("the server sent interim replies without end")
            return
        self._complete()

    @staticmethod
    def _is_interim(status: int) -> bool:
        return 100 <= status < 200 and status != 101  # 101 raises HttpParserUpgrade

    def _complete(self) -> None:
        """The final reply is read: hand it to the waiter; the connection reads nothing more."""
        self._in_flight = False
        headers: CIMultiDict[str] = CIMultiDict(
            [(name.decode("latin-1"), value.decode("latin-1")) for name, value in self._headers]
        )
        encoding = headers.get("content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("identity", ""):
            self._fail(PlainHttpError("the server sent a compressed response (none was asked for)"))
            return
        assert self._parser is not None
        self.keep_alive = self._parser.should_keep_alive()
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
        self._head_bytes = self._interim = 0
        self._answered = self._overflow = self._headers_done = False
        self._in_flight = True
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
        self.closed = True  # never handed out again, even before connection_lost comes
        self._in_flight = False
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


# RFC 9110 5.6.2: a token is visible ASCII other than the delimiters. Regular expressions, as
# h11 checks them: a per-character generator was 2.5 us of every request (docs/benchmarks.md).
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_SPLITS_A_LINE = re.compile(r"[\r\n\0]")
_OUTSIDE_LATIN_1 = re.compile(r"[^\x00-\xff]")


def check_header(name: str, value: str) -> None:
    """Refuse a header that would split the request (RFC 9110 5.1, 5.5): a name that is not a
    token, a CR, LF or NUL in the value. The message names the header, never its value (a key
    may be in it)."""
    if _TOKEN.fullmatch(name) is None:
        raise ValueError(f"header name {name!r} is not an HTTP token")
    if _SPLITS_A_LINE.search(value) is not None:
        raise ValueError(f"header {name!r} has a CR, LF or NUL in its value")
    if _OUTSIDE_LATIN_1.search(value) is not None:
        raise ValueError(f"header {name!r} has a character outside Latin-1 in its value")


def _header_lines(headers: Mapping[str, str]) -> str:
    for name, value in headers.items():
        check_header(name, value)
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items())


class PlainHttpPool:
    """Keep-alive connections to one `http://host:port`, reused last in, first out."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"not an http:// base URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        host_header = parts.netloc.rpartition("@")[2]
        fixed = {"Host": host_header, "Accept-Encoding": "identity", **headers}
        self._fixed = _header_lines(fixed).encode("latin-1")
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
        `PlainHttpError` (transport), `ResponseTooLarge`, TimeoutError, or ValueError for a
        header that would split the request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s

        def left() -> float:
            return max(0.001, deadline - loop.time())

        head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._fixed
        if headers:
            head += _header_lines(headers).encode("latin-1")
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
                _, protocol = await loop.create_connection(_Connection, self.host, self.port)
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
