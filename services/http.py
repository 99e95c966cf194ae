"""One pooled HTTP client per upstream, with a concurrency bound, timeouts and careful retries.

Every external service (Serper, SerpAPI, Jina, a judge, SGLang) is reached through an `Upstream`.
Tests point its `base_url` at a local server, or hand it an `httpx` transport; nothing is patched.

The client is an `httpx.AsyncClient` whose default transport is aiohttp's connection pool
(`httpx-aiohttp`): httpcore's pool re-scans every connection for every queued request, which
costs ~17 ms of CPU per request at 64 concurrent requests on these machines, against ~1 ms
through aiohttp (measured side by side; see the tool-server benchmark notes in the README).

Retry rules (the lessons of earlier search agents): retry only 429, 5xx and transport errors,
with full-jitter exponential backoff; honour `Retry-After`; never sleep past the caller's
deadline; 401/402/403 mean a key problem that no retry fixes: reported once, clearly, and raised.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anyio
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from services.exceptions import (
    UpstreamAuthError,
    UpstreamBadResponse,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamUnavailable,
)
from services.logs import log_event, redact, redact_third_party_loggers
from services.metrics import ServiceMetrics

logger = logging.getLogger("deepdive.upstream")
redact_third_party_loggers()

_AUTH_STATUSES = frozenset({401, 402, 403})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry an upstream.

    max_attempts counts the first try. Backoff before retry k (1-based) is uniform in
    [0, min(max_delay_s, base_delay_s * 2**(k-1))]; a Retry-After header raises it to at least
    the advertised wait, and a wait over max_retry_after_s is not attempted at all.
    """

    max_attempts: int = 4
    base_delay_s: float = 0.25
    max_delay_s: float = 8.0
    max_retry_after_s: float = 30.0

    def backoff(self, retry_number: int) -> float:
        cap = min(self.max_delay_s, self.base_delay_s * 2 ** (retry_number - 1))
        return random.uniform(0.0, cap)


@dataclass(frozen=True)
class UpstreamSettings:
    """Where an upstream lives and how hard we may push it."""

    base_url: str
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_concurrency: int = 32
    max_response_bytes: int = 10_000_000
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass(frozen=True)
class UpstreamReply:
    """A finished exchange: the response (its stream closed) and its body, read within the cap."""

    response: httpx.Response
    content: bytes

    @property
    def status_code(self) -> int:
        return self.response.status_code

    @property
    def headers(self) -> httpx.Headers:
        return self.response.headers


ErrorClassifier = Callable[[UpstreamReply], "UpstreamError | None"]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Upstream:
    """A named upstream: one `httpx.AsyncClient`, a concurrency bound and the retry policy."""

    def __init__(
        self,
        name: str,
        settings: UpstreamSettings,
        *,
        headers: dict[str, str] | None = None,
        metrics: ServiceMetrics | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        key_hint: str | None = None,
        classify_error: ErrorClassifier | None = None,
    ) -> None:
        self.name = name
        self.classify_error = classify_error
        self.settings = settings
        self.metrics = metrics
        self.key_hint = key_hint
        self.auth_failure: str | None = None
        self._slots = anyio.Semaphore(settings.max_concurrency)
        limits = httpx.Limits(
            max_connections=settings.max_concurrency,
            max_keepalive_connections=settings.max_concurrency,
        )
        self.client = httpx.AsyncClient(
            base_url=settings.base_url,
            headers=headers,
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
            transport=transport or AiohttpTransport(limits=limits, trust_env=False),
            follow_redirects=False,
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(
        self, method: str, url: str, *, deadline: float | None = None, **kwargs: Any
    ) -> UpstreamReply:
        """Send with retries; return a reply with status < 400 or raise an `UpstreamError`.

        `deadline` is an absolute `time.monotonic()` instant: no attempt and no backoff sleep
        extends past it. `kwargs` go to `httpx.AsyncClient.build_request`.
        """
        policy = self.settings.retry
        attempt = 0
        while True:
            attempt += 1
            retry_after: float | None = None
            timeout = self._attempt_timeout(deadline)
            try:
                async with self._slots:
                    self._count_call()
                    reply = await self._attempt(method, url, timeout, kwargs)
            except (httpx.TransportError, aiohttp.ClientError) as exc:
                cause = exc.__cause__ or exc  # name the transport's own error, not its mapping
                detail = redact(str(exc)) or "no detail"
                error: UpstreamError = UpstreamUnavailable(
                    self.name, f"{type(cause).__name__} ({detail})"
                )
            else:
                status = reply.status_code
                if status < 400:
                    return reply
                special = self.classify_error(reply) if self.classify_error else None
                if isinstance(special, UpstreamAuthError):
                    raise self._auth_error(status, special.message)
                if special is not None:
                    self._count_error(special.code)
                    raise special
                if status in _AUTH_STATUSES:
                    raise self._auth_error(status)
                if status == 429:
                    retry_after = parse_retry_after(reply.headers.get("retry-after"))
                    error = UpstreamRateLimited(self.name, "HTTP 429 (rate limited)")
                elif status >= 500:
                    error = UpstreamUnavailable(self.name, f"HTTP {status}")
                else:
                    self._count_error("http_4xx")
                    raise UpstreamBadResponse(self.name, f"HTTP {status} (request refused)")
            self._count_error(error.code)
            if attempt >= policy.max_attempts:
                raise type(error)(self.name, f"{_detail(error)} after {attempt} attempts")
            delay = policy.backoff(attempt)
            if retry_after is not None:
                if retry_after > policy.max_retry_after_s:
                    raise type(error)(
                        self.name, f"{_detail(error)}; Retry-After {retry_after:.0f}s is too long"
                    )
                delay = max(delay, retry_after)
            if deadline is not None and time.monotonic() + delay >= deadline:
                raise type(error)(
                    self.name, f"{_detail(error)}; no time left to retry within the deadline"
                )
            await anyio.sleep(delay)

    async def _attempt(
        self, method: str, url: str, limits: httpx.Timeout, kwargs: dict[str, Any]
    ) -> UpstreamReply:
        if "json" in kwargs:  # orjson: stdlib json, which httpx uses, is the costliest step here
            kwargs = dict(kwargs)
            kwargs["content"] = orjson.dumps(kwargs.pop("json"))
            kwargs["headers"] = {
                **(kwargs.get("headers") or {}),
                "Content-Type": "application/json",
            }
        request = self.client.build_request(method, url, timeout=limits, **kwargs)
        response = await self.client.send(request, stream=True)
        try:
            limit = self.settings.max_response_bytes
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise self._too_large(limit)
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > limit:
                    raise self._too_large(limit)
                chunks.append(chunk)
        finally:
            await response.aclose()
        return UpstreamReply(response, b"".join(chunks))

    def _too_large(self, limit: int) -> UpstreamBadResponse:
        self._count_error("too_large")
        return UpstreamBadResponse(self.name, f"the response is larger than {limit} bytes")

    def _attempt_timeout(self, deadline: float | None) -> httpx.Timeout:
        read = self.settings.read_timeout_s
        if deadline is not None:
            read = max(0.001, min(read, deadline - time.monotonic()))
        return httpx.Timeout(read, connect=min(read, self.settings.connect_timeout_s))

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
        if self.metrics is not None:
            self.metrics.upstream_calls.labels(self.name).inc()

    def _count_error(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(self.name, kind).inc()


def _detail(error: UpstreamError) -> str:
    return error.message.removeprefix(f"{error.upstream}: ")


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
