"""The tool server's HTTP surface: POST /tool, GET /health, /ready, /metrics.

POST /tool takes deepdive.protocol's ToolRequest {session_id, name, arguments,
remote_env_info: {forbidden_texts}} and answers 200 with its ToolReply {output, observation}
(the same text, as DeepDive's rollout expects) and, when the call failed, "error": {code,
kind, message}; the failure text is also the observation. A malformed envelope is a 4xx
naming the field.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import ASGIApp, Receive, Scope

from deepdive.protocol import Failure, ToolReply, ToolRequest
from services.base.errors import RequestError, ToolError
from services.base.logs import log_event, redact
from services.serving.metrics import ServiceMetrics
from services.tool_server.tools import ToolExecutor
from services.web import read_json, request_error, service_app

logger = logging.getLogger("deepdive.tool_server")


def create_app(
    executor: ToolExecutor, metrics: ServiceMetrics, token: str | None = None
) -> ASGIApp:
    """The ASGI app around a ready executor. `token` turns on bearer auth (all but /health)."""
    max_body = executor.config.max_body_bytes

    async def tool(scope: Scope, receive: Receive) -> tuple[int, Any]:
        started = time.perf_counter()
        name = "invalid"
        try:
            call = ToolRequest.parse(await read_json(scope, receive, max_body))
        except RequestError as error:
            _record(metrics, name, error.code, started, session=None, cache=None)
            return request_error(error)
        name = call.name if call.name in executor.tool_names else "unknown"  # bounded labels
        try:
            outcome = await executor.call(call)
        except ToolError as error:
            _record(metrics, name, error.code, started, call.session_id, cache=None)
            message = redact(error.message)  # an upstream may echo a key back in its error
            return 200, ToolReply(message, Failure(error.code, message)).as_json()
        _record(metrics, name, "ok", started, call.session_id, outcome.cache)
        return 200, ToolReply(outcome.text).as_json()

    return service_app(
        # DeepDive's rollout posts to the root too
        fast={"/tool": tool, "/": tool},
        metrics=metrics,
        not_ready=executor.not_ready_reasons,
        ready_details=lambda: {
            "search": executor.search_provider.name,
            "reader": executor.reader.name,
        },
        on_shutdown=executor.aclose,
        token=token,
    )


def _record(
    metrics: ServiceMetrics,
    tool: str,
    outcome: str,
    started: float,
    session: str | None,
    cache: str | None,
) -> None:
    seconds = time.perf_counter() - started
    metrics.observe_request(tool, outcome, seconds)
    log_event(
        logger,
        "tool_call",
        session=session,
        tool=tool,
        ms=f"{seconds * 1000:.1f}",
        cache=cache,
        outcome=outcome,
    )
