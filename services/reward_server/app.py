"""The reward server's HTTP surface: POST /evaluate, POST /evaluate/batch, /health, /ready, /metrics.

slime reads the scalar with `--reward-key reward`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
from starlette.types import ASGIApp, Receive, Scope

from deepdive.protocol import RewardRequest
from services.base.errors import RequestError
from services.base.logs import log_event
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluation, Evaluator
from services.serving.metrics import ServiceMetrics
from services.web import read_json, request_error, service_app

logger = logging.getLogger("deepdive.reward_server")


def create_app(
    config: RewardServerConfig,
    evaluator: Evaluator,
    metrics: ServiceMetrics,
    token: str | None = None,
) -> ASGIApp:
    async def evaluate(scope: Scope, receive: Receive) -> tuple[int, Any]:
        started = time.perf_counter()
        try:
            item = RewardRequest.parse(await read_json(scope, receive, config.max_body_bytes))
        except RequestError as error:
            metrics.observe_request("evaluate", error.code, time.perf_counter() - started)
            return request_error(error)
        evaluation = await evaluator.evaluate(item)
        _record(metrics, "evaluate", evaluation, started)
        return 200, evaluation.as_json()

    async def evaluate_batch(scope: Scope, receive: Receive) -> tuple[int, Any]:
        started = time.perf_counter()
        try:
            body = await read_json(scope, receive, config.max_body_bytes)
            if isinstance(body, dict) and "items" in body:
                body = body["items"]
            if not isinstance(body, list):
                raise RequestError(
                    'the batch must be a JSON list of evaluation requests (or {"items": [...]})'
                )
            if len(body) > config.max_batch:
                raise RequestError(
                    f"the batch has {len(body)} items; the limit is {config.max_batch}"
                )
            items = [
                RewardRequest.parse(entry, where=f"item {i}: ") for i, entry in enumerate(body)
            ]
        except RequestError as error:
            metrics.observe_request("evaluate_batch", error.code, time.perf_counter() - started)
            return request_error(error)
        results: list[dict[str, Any]] = [{} for _ in items]

        async def run(index: int) -> None:
            evaluation = await evaluator.evaluate(items[index])
            _record(metrics, "evaluate", evaluation, started)
            results[index] = evaluation.as_json()

        async with anyio.create_task_group() as group:
            for index in range(len(items)):
                group.start_soon(run, index)
        metrics.observe_request("evaluate_batch", "ok", time.perf_counter() - started)
        return 200, results

    def not_ready() -> dict[str, str]:
        reason = evaluator.judge.not_ready_reason()
        return {f"judge:{evaluator.judge.name}": reason} if reason else {}

    return service_app(
        fast={"/evaluate": evaluate, "/evaluate/batch": evaluate_batch},
        metrics=metrics,
        not_ready=not_ready,
        ready_details=lambda: {"judge": evaluator.judge.name},
        on_shutdown=evaluator.judge.aclose,
        token=token,
    )


def _record(
    metrics: ServiceMetrics, operation: str, evaluation: Evaluation, started: float
) -> None:
    seconds = time.perf_counter() - started
    metrics.observe_request(operation, evaluation.outcome, seconds)
    verdict = evaluation.verdict
    log_event(
        logger,
        "evaluation",
        reward=evaluation.reward,
        format_ok=evaluation.format.ok,
        judge=evaluation.judge_name,
        verdict=None if verdict is None else verdict.correct,
        outcome=evaluation.outcome,
        ms=f"{seconds * 1000:.1f}",
    )
