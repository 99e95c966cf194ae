"""Starlette pieces every service uses: orjson responses (secrets redacted), bounded JSON bodies,
bearer auth, probes.

The contract for clients: malformed input is a 4xx whose JSON body names what is wrong; nothing
ever answers with a traceback. An unexpected bug still answers 500 with a generic message (and
is logged), so a client never sees internals.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.base.errors import InvalidJSON, PayloadTooLarge, RequestError
from services.base.logs import log_event, redact_json
from services.base.secrets import TOKEN_ENV
from services.serving.metrics import ServiceMetrics

logger = logging.getLogger("deepdive.web")


def json_bytes(content: Any) -> bytes:
    """Every JSON body a service sends is made here, so this is where secrets are taken out:
    an upstream can echo a key back into an observation, a judge's reason or an error message,
    and only a check on the final bytes catches all of them."""
    return redact_json(orjson.dumps(content))


def json_response(content: Any, status_code: int = 200) -> Response:
    return Response(json_bytes(content), status_code=status_code, media_type="application/json")


def error_body(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message}}


class JsonAnswer(NamedTuple):
    """What a JSON endpoint answers: the status and the content sent as JSON (through
    `json_bytes`). The error helpers answer this, whichever way the endpoint is served: a
    FastRoutes endpoint returns it, a Starlette route returns its `response()`."""

    status: int
    content: Any

    def response(self) -> Response:
        return json_response(self.content, status_code=self.status)


def request_error(error: RequestError) -> JsonAnswer:
    """A malformed request's answer: the 4xx naming what is wrong."""
    return JsonAnswer(error.status_code, error_body(error.code, error.message))


def internal_error(path: str, exc: Exception) -> JsonAnswer:
    """A bug's answer: logged with its type, a 500 without internals."""
    log_event(logger, "internal_error", logging.ERROR, path=path, error=type(exc).__name__)
    logger.debug("internal error details", exc_info=exc)
    return JsonAnswer(500, error_body("internal_error", "internal server error"))


class ClientDisconnected(RequestError):
    """The client went away before its body was complete: its problem, not a bug of ours, so
    it is a request outcome (metrics, an INFO line at most), never an internal_error."""

    code = "client_disconnected"
    status_code = 400


# A hot endpoint: POST, served from the ASGI scope and receive channel alone (FastRoutes), and
# answering (status, JSON content): a JsonAnswer, or a plain pair.
JsonEndpoint = Callable[[Scope, Receive], Awaitable[tuple[int, Any]]]


def _content_length(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The Content-Length header from the ASGI scope's raw headers (lower-case names, as the
    servers give them): building Starlette's `Headers` for one lookup costs more than the scan."""
    for name, value in headers:
        if name == b"content-length":
            return value.decode("latin-1")
    return None


async def read_json_body(request: Request, max_bytes: int) -> Any:
    """The request body parsed as JSON; 413 past `max_bytes`, 400 when it is not JSON or the
    client disconnected before sending all of it."""
    return await read_json(request.scope, request.receive, max_bytes)


async def read_json(scope: Scope, receive: Receive, max_bytes: int) -> Any:
    """`read_json_body` on the raw ASGI channel (the hot endpoints build no Request)."""
    declared = _content_length(scope["headers"])
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(
            f"request body of {declared} bytes is over the {max_bytes}-byte limit"
        )
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected(
                f"the client disconnected after {size} bytes of the request body"
            )
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"request body is over the {max_bytes}-byte limit")
        chunks.append(chunk)
        more = message.get("more_body", False)
    body = b"".join(chunks)
    if not body:
        raise InvalidJSON("the request body is empty; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None


async def internal_error_handler(request: Request, exc: Exception) -> Response:
    """Last resort: log the bug with its type, answer 500 without internals."""
    return internal_error(request.url.path, exc).response()


class FastRoutes:
    """The hot POST endpoints (a tool call, an evaluation) served before Starlette's stack.

    Profiled at 256 sessions, Starlette's per-request path (error and exception middleware,
    the router's regex match, the Request and Response objects, three wrapped `send`s) was
    ~20 % of a cached tool call's CPU. The contract is the same: an endpoint answers JSON
    (redacted by `json_bytes`), a bug is a logged 500 without internals, and every other path
    and method, the lifespan included, is Starlette's (so GET /tool is still its 405).
    """

    def __init__(self, endpoints: dict[str, JsonEndpoint], app: ASGIApp) -> None:
        self.endpoints = endpoints
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = self.endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        try:
            status, content = await endpoint(scope, receive)
        except Exception as exc:  # the last resort, as internal_error_handler is Starlette's
            status, content = internal_error(scope["path"], exc)
        body = json_bytes(content)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-length", str(len(body)).encode("latin-1")),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def starlette_endpoint(endpoint: JsonEndpoint) -> Callable[[Request], Awaitable[Response]]:
    """The same endpoint as a Starlette route (what answers where FastRoutes is not in front:
    Starlette's own test client on the inner app, say)."""

    async def route(request: Request) -> Response:
        return JsonAnswer(*await endpoint(request.scope, request.receive)).response()

    return route


async def health(_: Request) -> Response:
    """Liveness: the process answers. Readiness is /ready."""
    return json_response({"status": "ok"})


def metrics_endpoint(metrics: ServiceMetrics) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(_: Request) -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    return endpoint


def bearer_token(authorization: bytes) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` value, else None. The scheme is
    case-insensitive (RFC 7235) and may be followed by several spaces; the token is kept exact."""
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() != b"bearer":
        return None
    return token.lstrip(b" ") or None


class BearerAuthMiddleware:
    """Require `Authorization: Bearer <token>` on every HTTP path except the liveness probe.

    Pure ASGI (no BaseHTTPMiddleware) to keep the per-request cost to a header lookup.
    """

    def __init__(
        self, app: ASGIApp, token: str, open_paths: frozenset[str] = frozenset({"/health"})
    ):
        self.app = app
        self._expected = token.encode()
        self._open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self._open_paths:
            await self.app(scope, receive, send)
            return
        supplied = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                supplied = value
                break
        token = bearer_token(supplied)
        if token is not None and hmac.compare_digest(token, self._expected):
            await self.app(scope, receive, send)
            return
        response = json_response(
            error_body("unauthorized", f"missing or wrong bearer token (see {TOKEN_ENV})"),
            status_code=401,
        )
        await response(scope, receive, send)


def service_app(
    routes: Sequence[Route] = (),
    *,
    fast: dict[str, JsonEndpoint] | None = None,
    metrics: ServiceMetrics,
    not_ready: Callable[[], dict[str, str]],
    ready_details: Callable[[], dict[str, Any]],
    on_shutdown: Callable[[], Awaitable[None]],
    token: str | None = None,
) -> ASGIApp:
    """A service's app: its own routes plus /health, /ready and /metrics, bearer auth when
    `token` is set, no tracebacks to clients, and `on_shutdown` run when the server stops.
    `fast` endpoints (POST) are served by FastRoutes in front of Starlette, behind the auth."""

    async def ready(_: Request) -> Response:
        reasons = not_ready()
        if reasons:
            return json_response({"status": "not_ready", "reasons": reasons}, status_code=503)
        return json_response({"status": "ready", **ready_details()})

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await on_shutdown()

    fast = fast or {}
    app = Starlette(
        routes=[
            *routes,
            *(Route(path, starlette_endpoint(e), methods=["POST"]) for path, e in fast.items()),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/metrics", metrics_endpoint(metrics), methods=["GET"]),
        ],
        exception_handlers={Exception: internal_error_handler},
        lifespan=lifespan,
    )
    served: ASGIApp = FastRoutes(fast, app) if fast else app
    return BearerAuthMiddleware(served, token=token) if token else served
