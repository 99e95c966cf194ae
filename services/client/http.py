"""One pooled HTTP client per upstream, with a concurrency bound, timeouts and careful retries.

Every external service (Serper, SerpAPI, Jina, a judge, SGLang, our own services) is reached
through an `Upstream`. Tests point its `base_url` at a local HTTP server; nothing is patched.

The pool is aiohttp's for everything that leaves the cluster; the rollout's plain http:// hops
to our own services and SGLang go through services/client/plain_http.py (`plain_http=True`, set only
by deepdive.clients). Measured side by side on these machines at 64 concurrent requests:
httpx on httpcore costs ~17 ms of CPU per request (its pool re-scans every connection for every
queued request), httpx on an aiohttp transport 0.77 ms, aiohttp alone 0.36 ms; a rollout turn
makes two such calls, so the client is most of a turn's cost.

What is retried is read here: only 429, 5xx and transport errors (and a mismatched reply);
401/402/403 mean a key problem that no retry fixes: reported once, clearly, and raised. How
(jittered backoff, `Retry-After`, never past the caller's deadline) is
services/client/retries.py's.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import select
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp.connector import Connection
from aiohttp.helpers import get_env_proxy_for_url
from aiohttp.tracing import Trace
from yarl import URL

from services.base.clock import SYSTEM_CLOCK, Clock
from services.base.errors import (
    ConfigError,
    DeepDiveError,
    UpstreamAuthError,
    UpstreamBadResponse,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamUnavailable,
)
from services.base.logs import log_event, redact, redact_third_party_loggers
from services.base.secrets import register_proxy_secrets
from services.client.plain_http import PlainHttpError, PlainHttpPool, ResponseTooLarge, check_header
from services.client.retries import Retry, RetryPolicy, parse_retry_after, read_budget, with_retries

if TYPE_CHECKING:  # the rollout inside slime uses Upstream and never loads prometheus
    from services.serving.metrics import ServiceMetrics

__all__ = [
    "ErrorClassifier",
    "MismatchedReply",
    "Upstream",
    "UpstreamProvider",
    "UpstreamReply",
    "UpstreamSettings",
    "decode_json_object",
    "echoed_query",
    "only_2xx",
]

logger = logging.getLogger("deepdive.upstream")
redact_third_party_loggers()

_AUTH_STATUSES = frozenset({401, 402, 403})


# A proxy's URL without its credentials, and the header that carries them (None: go direct).
_Proxy = tuple["URL | None", "dict[str, str] | None"]


class MismatchedReply(UpstreamBadResponse):
    """A reply that is not the answer to the request that was sent (a search reply naming
    another query): never an answer, never cached; retried like a transport failure, and an
    `UpstreamBadResponse` once the attempts are spent."""

    code = "upstream_mismatched_reply"


# Checks a reply with a 2xx status before `send` returns it: raises MismatchedReply (retried)
# or another UpstreamError (raised as it is) when the reply cannot be the request's answer.
ReplyCheck = Callable[["UpstreamReply"], None]


def _readable(transport: asyncio.BaseTransport) -> bool:
    """Whether the socket under `transport` has bytes (or an end of stream) waiting: a poll
    with no wait, what httpcore asks of a pooled socket before reusing it."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return True  # nothing to ask: not a connection to trust
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def _rest(transport: asyncio.BaseTransport) -> None:
    """On release to the pool: stop reading, so bytes that arrive while idle wait in the socket
    (where the next acquire sees them) instead of being parsed as the next request's reply."""
    if isinstance(transport, asyncio.ReadTransport) and not transport.is_closing():
        transport.pause_reading()


class ReuseCheckedConnector(aiohttp.TCPConnector):
    """aiohttp's connector, reusing a pooled connection only if nothing arrived on it while it
    idled (aiohttp hands such bytes to the next request: aio-libs/aiohttp#13656).

    Built on the public API alone: `connect()` and the connection's `add_callback`. A connection
    stops reading when released; on acquire, one that has anything waiting (an unasked reply,
    the head of one, an end of stream) or that aiohttp itself marks `should_close` is closed
    and the next taken, down to a new one. A TLS connection also counts the bytes its TLS layer
    holds (`get_read_buffer_size`): pausing it pauses the application side only."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handed_out: weakref.WeakSet[Any] = weakref.WeakSet()
        self.discarded = 0  # pooled connections closed because something arrived while idle

    async def connect(
        self,
        req: aiohttp.ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's signature)
    ) -> Connection:
        while True:
            connection = await super().connect(req, traces, timeout)
            protocol = connection.protocol
            transport = connection.transport
            if protocol is None or transport is None:
                return connection  # closed under us: aiohttp's own error follows
            if protocol in self._handed_out and _arrived_while_idle(protocol, transport):
                self.discarded += 1
                connection.close()
                continue
            self._handed_out.add(protocol)
            if isinstance(transport, asyncio.ReadTransport) and not transport.is_reading():
                transport.resume_reading()
            connection.add_callback(functools.partial(_rest, transport))
            return connection


def _arrived_while_idle(protocol: Any, transport: asyncio.BaseTransport) -> bool:
    if protocol.should_close or transport.is_closing():
        return True
    if isinstance(transport, asyncio.ReadTransport) and transport.get_extra_info("sslcontext"):
        try:
            if transport.get_read_buffer_size() > 0:  # type: ignore[attr-defined]
                return True
        except (AttributeError, NotImplementedError):
            pass
    return _readable(transport)


class ProxiedServerDisconnected(aiohttp.ServerDisconnectedError):
    """A connection through a proxy closed before the reply: from the client's side the proxy
    (gone behind a port forward, or refusing) and the server beyond it look the same."""


# What a transport failure means, in words a model (or a person) can read: aiohttp's own text
# names its internals ("ClientPayloadError (Response payload is not completed: <Content...>)").
# First match wins, so a subclass comes before its base; an exception not listed is named by
# its type alone.
_TRANSPORT_WORDS: tuple[tuple[type[BaseException], str], ...] = (
    (aiohttp.ClientPayloadError, "the connection closed before the response was complete"),
    (ProxiedServerDisconnected, "the proxy or the server beyond it closed the connection"),
    (aiohttp.ServerDisconnectedError, "the server closed the connection"),
    (TimeoutError, "timed out"),  # aiohttp's timeout errors all derive from it
    (
        aiohttp.ClientConnectorCertificateError,
        "could not connect (the TLS certificate was refused)",
    ),
    (aiohttp.ClientSSLError, "could not connect (the TLS handshake failed)"),
    (aiohttp.ClientProxyConnectionError, "could not connect to the proxy (HTTPS_PROXY)"),
    (aiohttp.ClientConnectorError, "could not connect"),
    (ConnectionResetError, "the connection was reset"),
    (aiohttp.ClientConnectionError, "the connection failed"),
    (aiohttp.InvalidURL, "the URL is not valid"),
    (aiohttp.ClientResponseError, "the server sent a malformed response"),
)


# Why a connect failed, from the socket's errno: what tells a closed port from a node without
# a route out (`unshare -n`: ENETUNREACH) when an egress probe fails (slurm/node/egress.py).
_SOCKET_REASONS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTUNREACH: "no route to host",
    errno.ECONNRESET: "connection reset",
}


def transport_failure(exc: BaseException) -> str:
    """Plain words for a transport failure; the exception's type name for one not foreseen. A
    name that does not resolve says which, a proxy's refusal its status, a refused or
    unroutable connect why: the kinds a site's egress fails in."""
    if isinstance(exc, PlainHttpError):
        return exc.words
    if isinstance(exc, aiohttp.ClientConnectorDNSError):  # the proxy's own name, too
        return f"could not resolve the host name {exc.host} (DNS)"
    if isinstance(exc, aiohttp.ClientHttpProxyError):  # CONNECT answered with another status
        return f"the proxy refused the request (HTTP {exc.status}, HTTPS_PROXY)"
    for kind, words in _TRANSPORT_WORDS:
        if isinstance(exc, kind):
            reason = None
            if isinstance(exc, aiohttp.ClientConnectorError) and not isinstance(
                exc, aiohttp.ClientSSLError
            ):
                reason = _SOCKET_REASONS.get(exc.os_error.errno or 0)
            return f"{words}: {reason}" if reason else words
    return type(exc).__name__


@dataclass(frozen=True)
class UpstreamSettings:
    """Where an upstream lives and how hard we may push it."""

    base_url: str
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_concurrency: int = 32
    max_response_bytes: int = 10_000_000
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # True only for plain http:// hops inside the cluster (the rollout's calls to our own
    # services and SGLang): calls services.client.plain_http can make (a path under base_url, a JSON
    # or bytes body) go through it, about a third of aiohttp's CPU per request. Everything that
    # leaves the cluster keeps the default: aiohttp for every call.
    plain_http: bool = False
    # False: a connection per request (aiohttp's force_close), for the judge and the page
    # readers, whose calls are few and slow next to a connect: no pooled connection, no reply
    # an earlier exchange left behind. Search APIs keep the pool (checked on reuse).
    pool_connections: bool = True


@dataclass(frozen=True)
class UpstreamReply:
    """A finished exchange: status, headers (case-insensitive), the body read within the cap."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes
    charset: str | None = None

    def text(self) -> str:
        try:
            return self.content.decode(self.charset or "utf-8", errors="replace")
        except LookupError:  # an unknown charset name
            return self.content.decode("utf-8", errors="replace")


# Reads a refused reply (status >= 400) before the generic rules: an UpstreamAuthError is a key
# problem (reported once, /ready off); any other error is raised as it is, never retried (a
# ToolError for a provider; a ConfigError where a status means the URL itself is wrong).
ErrorClassifier = Callable[[UpstreamReply], "DeepDiveError | None"]


class Upstream:
    """A named upstream: one pooled client (aiohttp's, or the lean one where `plain_http`
    asks), a concurrency bound and the retry policy."""

    def __init__(
        self,
        name: str,
        settings: UpstreamSettings,
        *,
        headers: dict[str, str] | None = None,
        metrics: ServiceMetrics | None = None,
        key_hint: str | None = None,
        classify_error: ErrorClassifier | None = None,
        clock: Clock = SYSTEM_CLOCK,
        through_proxy: bool = False,
    ) -> None:
        self.name = name
        # True for upstreams on the internet (search, page readers, a remote judge): they go
        # through the proxy HTTPS_PROXY / HTTP_PROXY name unless NO_PROXY covers the host,
        # as most GPU nodes reach the internet. Hops inside the cluster never do.
        self.through_proxy = through_proxy
        self._proxies: dict[tuple[str, str | None, int | None], _Proxy] = {}
        if through_proxy:
            register_proxy_secrets()
        self.clock = clock  # deadlines are instants on it; backoffs sleep on it
        self.classify_error = classify_error
        self.settings = settings
        self.metrics = metrics
        self.key_hint = key_hint
        self.auth_failure: str | None = None
        self._headers = dict(headers or {})
        for header, value in self._headers.items():
            try:
                check_header(header, value)
            except ValueError as exc:
                raise ConfigError(f"{name}: {exc}") from None
        self._base = settings.base_url.rstrip("/")
        # asyncio's own semaphore: anyio's yields to the loop on every acquire (a checkpoint),
        # one more loop pass per call. The counts feed /metrics (in flight and waiting).
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self.in_flight = 0
        self.waiting = 0
        self._paths: dict[str, URL] = {}  # each path under base_url parsed once (both clients)
        # Without a deadline every attempt has the same timeout: built once, not per call.
        self._timeout = aiohttp.ClientTimeout(
            connect=min(settings.read_timeout_s, settings.connect_timeout_s),
            sock_read=settings.read_timeout_s,
        )
        # With a deadline further than the read timeout (a tool call's first attempt: 60 s
        # against Serper's 30) the attempt's timeout is the same every time: built once too.
        self._whole_timeout = aiohttp.ClientTimeout(
            total=settings.read_timeout_s,
            connect=min(settings.read_timeout_s, settings.connect_timeout_s),
        )
        # the calls counter's child, looked up once: labels() takes ~1.7 µs per call
        self._calls = metrics.upstream_calls.labels(name) if metrics is not None else None
        self._session: aiohttp.ClientSession | None = None
        self._plain: PlainHttpPool | None = None
        if settings.plain_http and self._base.startswith("http://"):
            try:
                self._plain = PlainHttpPool(self._base, self._headers)
            except ValueError:  # no host to pool for: every call is aiohttp's (and its error)
                self._plain = None
        if metrics is not None:
            metrics.watch_upstream(name, lambda: self.in_flight, lambda: self.waiting)

    def _open_session(self) -> aiohttp.ClientSession:
        """The pool is opened on first use, inside the event loop that will use it."""
        if self._session is None or self._session.closed:
            connector = ReuseCheckedConnector(
                limit=self.settings.max_concurrency,
                ttl_dns_cache=300,
                force_close=not self.settings.pool_connections,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers=self._headers,
                cookie_jar=aiohttp.DummyCookieJar(),  # API calls never carry state between them
                trust_env=False,
            )
        return self._session

    async def aclose(self) -> None:
        if self._plain is not None:
            self._plain.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        return f"{self._base}/{path.lstrip('/')}"

    def _request_url(self, path: str) -> str | URL:
        """A path under base_url as a parsed URL, parsed on first use (aiohttp parses a string
        on every request); an absolute URL (a page to read: unbounded, so not kept) as given."""
        if path.startswith(("http://", "https://")):
            return path
        parsed = self._paths.get(path)
        if parsed is None:
            parsed = self._paths[path] = URL(self.url(path))
        return parsed

    async def _attempt_in_slot(
        self, method: str, url: str, deadline: float | None, kwargs: dict[str, Any]
    ) -> UpstreamReply:
        """One attempt within the concurrency bound, counted as waiting, then in flight."""
        if self._slots.locked():
            self.waiting += 1
            try:
                await self._slots.acquire()
            finally:
                self.waiting -= 1
        else:
            await self._slots.acquire()
        self.in_flight += 1
        try:
            self._count_call()
            if self._plain is not None and _plain_call(method, url, kwargs):
                return await self._attempt_plain(self._plain, method, url, deadline, kwargs)
            return await self._attempt(method, self._request_url(url), deadline, kwargs)
        finally:
            self.in_flight -= 1
            self._slots.release()

    async def send(
        self,
        method: str,
        url: str,
        *,
        deadline: float | None = None,
        check: ReplyCheck | None = None,
        **kwargs: Any,
    ) -> UpstreamReply:
        """Send with retries; return a reply with status < 400 or raise an `UpstreamError`.

        `check`, where given, is an answer's contract: a reply that is not 2xx is refused
        (`UpstreamBadResponse`, not retried: a redirect or other status is no answer), and
        the check itself may refuse a 2xx reply (`MismatchedReply`: retried, then an
        `UpstreamBadResponse`).

        `url` is a path under `base_url`, or absolute. `deadline` is an instant on the
        upstream's clock (`time.monotonic()` unless one was given): no attempt and no backoff
        sleep extends past it. Keyword
        arguments: `json` (sent with orjson), `content` (bytes), `params`, `headers`, and
        `sni_hostname` (the TLS server name when the URL's host is a pinned address).
        """
        first = await self._try_once(method, url, deadline, check, kwargs, 1)
        if not isinstance(first, Retry):
            return first
        return await with_retries(
            functools.partial(self._try_once, method, url, deadline, check, kwargs),
            self.settings.retry,
            self.clock,
            deadline,
            self._given_up,
            first,
        )

    async def _try_once(
        self,
        method: str,
        url: str,
        deadline: float | None,
        check: ReplyCheck | None,
        kwargs: dict[str, Any],
        attempt: int,
    ) -> UpstreamReply | Retry:
        """One attempt and its reading: the reply to return, an error worth another attempt
        (counted), or an error raised as it is."""
        retry_after: float | None = None
        try:
            reply = await self._attempt_in_slot(method, url, deadline, kwargs)
        except (TimeoutError, aiohttp.ClientError, PlainHttpError) as exc:
            log_event(
                logger,
                "upstream_transport_error",
                logging.DEBUG,
                upstream=self.name,
                attempt=attempt,
                error=type(exc).__name__,
                detail=redact(str(exc)) or None,
            )
            error: UpstreamError = UpstreamUnavailable(self.name, transport_failure(exc))
        else:
            status = reply.status_code
            if status >= 400:
                error, retry_after = self._refused(reply)
            elif check is None:
                return reply
            elif status >= 300:
                self._count_error("not_2xx")
                raise UpstreamBadResponse(self.name, f"HTTP {status} is not an answer")
            else:
                try:
                    check(reply)
                except MismatchedReply as mismatch:
                    error = mismatch
                else:
                    return reply
        self._count_error(error.code)
        return Retry(error, retry_after)

    def _given_up(self, error: UpstreamError, why: str) -> UpstreamError:
        """The error raised once no attempt is left: a mismatched reply's as a bad response."""
        kind = UpstreamBadResponse if isinstance(error, MismatchedReply) else type(error)
        return kind(self.name, f"{_detail(error)}{why}")

    def _refused(self, reply: UpstreamReply) -> tuple[UpstreamError, float | None]:
        """A reply with status >= 400: raised where no retry helps, else the error to retry on
        and the Retry-After it advertised."""
        status = reply.status_code
        special = self.classify_error(reply) if self.classify_error else None
        if isinstance(special, UpstreamAuthError):
            raise self._auth_error(status, special.message)
        if special is not None:
            self._count_error(special.code)
            raise special
        if status in _AUTH_STATUSES:
            raise self._auth_error(status)
        if status == 407:  # only a proxy sends it (an http:// URL asked through one)
            self._count_error("proxy")
            raise UpstreamUnavailable(
                self.name,
                "HTTP 407: the proxy refused the request, it wants credentials (the "
                "user:password in HTTPS_PROXY / HTTP_PROXY)",
            )
        if status == 429:
            retry_after = parse_retry_after(reply.headers.get("retry-after"))
            return UpstreamRateLimited(self.name, "HTTP 429 (rate limited)"), retry_after
        if status >= 500:
            return UpstreamUnavailable(self.name, f"HTTP {status}"), None
        self._count_error("http_4xx")
        raise UpstreamBadResponse(self.name, f"HTTP {status} (request refused)")

    async def _attempt_plain(
        self,
        pool: PlainHttpPool,
        method: str,
        path: str,
        deadline: float | None,
        kwargs: dict[str, Any],
    ) -> UpstreamReply:
        """One attempt through the lean client: the whole exchange within the read timeout
        (or what is left of the deadline), the body within the response cap."""
        body, headers = _encoded_body(kwargs)
        target = self._request_url(path)
        assert isinstance(target, URL)  # _plain_call: a path under base_url
        limit = self.settings.max_response_bytes
        try:
            reply = await pool.request(
                method,
                target.raw_path_qs,
                body or b"",
                headers,
                timeout_s=read_budget(self.settings.read_timeout_s, deadline, self.clock),
                connect_timeout_s=self.settings.connect_timeout_s,
                limit=limit,
            )
        except ResponseTooLarge:
            raise self._too_large(limit) from None
        return UpstreamReply(reply.status, reply.headers, reply.content, reply.charset)

    def _attempt_timeout(self, deadline: float | None) -> aiohttp.ClientTimeout:
        if deadline is None:
            return self._timeout
        # The attempt ends by the deadline: one total timer, which also bounds every read.
        read = read_budget(self.settings.read_timeout_s, deadline, self.clock)
        if read == self.settings.read_timeout_s:
            return self._whole_timeout
        return aiohttp.ClientTimeout(total=read, connect=min(read, self.settings.connect_timeout_s))

    async def _attempt(
        self, method: str, url: str | URL, deadline: float | None, kwargs: dict[str, Any]
    ) -> UpstreamReply:
        body, headers = _encoded_body(kwargs)
        options = {key: value for key, value in kwargs.items() if key not in _BODY_KWARGS}
        if body is not None:
            options["data"] = body
        sni = options.pop("sni_hostname", None)
        if sni:
            options["server_hostname"] = sni
        if self.through_proxy:
            proxy, proxy_headers = self._proxy_for(url if isinstance(url, URL) else URL(url))
            if proxy is not None:
                # aiohttp moves an Authorization among proxy_headers to Proxy-Authorization
                # (on the request for http://, on the CONNECT for https://); a copy: it adds Host
                options["proxy"] = proxy
                options["proxy_headers"] = dict(proxy_headers) if proxy_headers else None
        session = self._open_session()
        try:
            async with session.request(
                method,
                url,
                headers=headers,
                timeout=self._attempt_timeout(deadline),
                allow_redirects=False,
                **options,
            ) as response:
                limit = self.settings.max_response_bytes
                length = response.content_length
                if length is not None and length > limit:
                    raise self._too_large(limit)
                if length is not None and "Content-Encoding" not in response.headers:
                    # A plain body of known size within the cap: read at once. A compressed one is
                    # counted as it inflates, below (its length says nothing of its inflated size).
                    body = await response.read()
                    return UpstreamReply(response.status, response.headers, body, response.charset)
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.content.iter_chunked(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        raise self._too_large(limit)
                    chunks.append(chunk)
                return UpstreamReply(
                    response.status, response.headers, b"".join(chunks), response.charset
                )
        except aiohttp.ServerDisconnectedError as exc:
            if "proxy" in options:  # the words say both could have closed it
                raise ProxiedServerDisconnected(exc.message) from exc
            raise

    def _proxy_for(self, url: URL) -> _Proxy:
        """The proxy the environment names for `url`'s origin, read once per origin: aiohttp's
        own reading (`trust_env=True` would read it, and ~/.netrc, in a thread per request)."""
        origin = (url.scheme, url.host, url.port)
        found = self._proxies.get(origin)
        if found is None:
            try:
                proxy, auth = get_env_proxy_for_url(url)
                found = (proxy, {"Authorization": auth.encode()} if auth else None)
            except LookupError:  # none set, or NO_PROXY covers the host
                found = (None, None)
            self._proxies[origin] = found
            log_event(
                logger,
                "upstream_route",
                upstream=self.name,
                host=url.host,
                proxy=str(found[0]) if found[0] is not None else "none",  # no user, password
            )
        return found

    def _too_large(self, limit: int) -> UpstreamBadResponse:
        self._count_error("too_large")
        return UpstreamBadResponse(self.name, f"the response is larger than {limit} bytes")

    def _auth_error(self, status: int, detail: str | None = None) -> UpstreamAuthError:
        self._count_error("auth")
        hint = f"; check {self.key_hint}" if self.key_hint else ""
        reason = "out of credit" if status == 402 else "key missing, invalid or not allowed"
        message = f"HTTP {status}: {detail or reason}{hint}"
        if self.auth_failure is None:
            log_event(
                logger, "upstream_auth_failed", logging.ERROR, upstream=self.name, status=status
            )
        self.auth_failure = message
        return UpstreamAuthError(self.name, message)

    def _count_call(self) -> None:
        if self._calls is not None:
            self._calls.inc()

    def _count_error(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(self.name, kind).inc()


_BODY_KWARGS = frozenset({"json", "content", "headers"})


def _encoded_body(kwargs: dict[str, Any]) -> tuple[bytes | None, dict[str, str] | None]:
    """The request's body as bytes (`json` through orjson, or `content` as given) and its headers
    (`json` adds its Content-Type), for either client."""
    headers = kwargs.get("headers")
    if "json" in kwargs:
        return orjson.dumps(kwargs["json"]), {**(headers or {}), "Content-Type": "application/json"}
    return kwargs.get("content"), headers


def _plain_call(method: str, url: str, kwargs: dict[str, Any]) -> bool:
    """Whether the lean client can make this call: a path under base_url, a JSON or bytes body,
    headers; anything else (an absolute URL, query parameters, a pinned TLS name, HEAD, whose
    reply's length describes a body that never comes) is aiohttp's."""
    return (
        method != "HEAD"
        and not url.startswith(("http://", "https://"))
        and kwargs.keys() <= _BODY_KWARGS
    )


def _detail(error: UpstreamError) -> str:
    return error.message.removeprefix(f"{error.upstream}: ")


def only_2xx(reply: UpstreamReply) -> None:
    """The check of a reply whose body has no more to match than its status (a verdict): 2xx
    is an answer, anything else (a redirect with a JSON body) a failure."""


def echoed_query(reply: UpstreamReply, upstream: str, field: str, query: str) -> dict[str, Any]:
    """A search API's reply as a JSON object, refused as `MismatchedReply` unless it repeats the
    query asked (`reply[field]["q"]`): what stands between one session's results and another's
    when a connection carries a reply nobody asked for."""
    data = decode_json_object(reply.content, upstream)
    echoed = data.get(field)
    asked = echoed.get("q") if isinstance(echoed, dict) else None
    if asked != query:
        raise MismatchedReply(upstream, f"the reply is for another query (its {field}.q)")
    return data


class UpstreamProvider:
    """Base of the providers that call one HTTP upstream: readiness and shutdown, written once.

    `key_env` names the variable the key comes from; `key_required` says whether the provider
    can serve without it (Jina can, at its free rate).
    """

    name: str
    key_env: str | None = None
    key_required = False

    def __init__(self, upstream: Upstream, has_key: bool = False) -> None:
        self.upstream = upstream
        self._has_key = has_key

    def not_ready_reason(self) -> str | None:
        if self.key_required and not self._has_key:
            return f"{self.key_env} is not set"
        return self.upstream.auth_failure

    async def aclose(self) -> None:
        await self.upstream.aclose()


def decode_json_object(content: bytes, upstream: str) -> dict[str, Any]:
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise UpstreamBadResponse(upstream, "the response is not valid JSON") from None
    if not isinstance(data, dict):
        raise UpstreamBadResponse(upstream, "the response is not a JSON object")
    return data
