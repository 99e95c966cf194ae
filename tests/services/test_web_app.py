"""service_app's layers: bearer auth, FastRoutes, then Starlette. The fast routes skip
Starlette's middleware stack, so that stack must hold nothing but what FastRoutes does itself
(Starlette's own error and exception layers, whose one handler FastRoutes mirrors): a
middleware added there would silently not run on the hot endpoints. And both error helpers
answer the same type, whichever way an endpoint is served."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.routing import Router
from starlette.types import ASGIApp, Receive, Scope

from services.base.errors import PayloadTooLarge
from services.serving.metrics import ServiceMetrics
from services.web import (
    BearerAuthMiddleware,
    FastRoutes,
    JsonAnswer,
    internal_error,
    internal_error_handler,
    request_error,
    service_app,
)


async def _nothing() -> None:
    return None


async def echo(scope: Scope, receive: Receive) -> tuple[int, Any]:
    return 200, {"ok": True}


def layers(app: ASGIApp) -> list[Any]:
    found = [app]
    while hasattr(found[-1], "app") and not isinstance(found[-1], Router):
        found.append(found[-1].app)
    return found


def the_app(token: str | None) -> ASGIApp:
    return service_app(
        fast={"/tool": echo},
        metrics=ServiceMetrics("probe"),
        not_ready=dict,
        ready_details=dict,
        on_shutdown=_nothing,
        token=token,
    )


def test_service_app_has_no_starlette_middleware_the_fast_routes_would_skip() -> None:
    for token in (None, "a-service-token"):
        outer = layers(the_app(token))
        kinds = [type(layer) for layer in outer]
        expected = [FastRoutes, Starlette]
        assert kinds == ([BearerAuthMiddleware, *expected] if token else expected)
        starlette = outer[-1]
        assert starlette.user_middleware == []
        stack = layers(starlette.build_middleware_stack())
        assert [type(layer) for layer in stack] == [
            ServerErrorMiddleware,
            ExceptionMiddleware,
            Router,
        ]
        # the one exception handler, the one FastRoutes mirrors with internal_error
        assert starlette.exception_handlers == {Exception: internal_error_handler}


def test_both_error_helpers_answer_the_same_type() -> None:
    refused = request_error(PayloadTooLarge("too big"))
    failed = internal_error("/tool", RuntimeError("a bug"))
    assert refused == JsonAnswer(
        413, {"error": {"code": "payload_too_large", "message": "too big"}}
    )
    assert failed == JsonAnswer(
        500, {"error": {"code": "internal_error", "message": "internal server error"}}
    )
    assert refused.response().status_code == 413
    assert bytes(failed.response().body) == (
        b'{"error":{"code":"internal_error","message":"internal server error"}}'
    )
