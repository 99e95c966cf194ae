"""A server that is not ours but answers POST /tool, /evaluate and /evaluate/batch as ours do
(200, the JSON the rollout reads), so only its /health tells it apart: for the tests of
deepdive.service_check. `health` is the body /health answers with 200; None: no /health (404).
"""

from __future__ import annotations

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

OBSERVATION = {"output": "【1】A page\nhttps://x.example/\nText.", "observation": "A page"}
REWARD = {"reward": 1}


def look_alike_app(health: bytes | None) -> Starlette:
    async def tool(_: Request) -> Response:
        return Response(orjson.dumps(OBSERVATION), media_type="application/json")

    async def evaluate(_: Request) -> Response:
        return Response(orjson.dumps(REWARD), media_type="application/json")

    async def evaluate_batch(request: Request) -> Response:
        items = orjson.loads(await request.body())
        return Response(orjson.dumps([REWARD] * len(items)), media_type="application/json")

    async def answer_health(_: Request) -> Response:
        return Response(health or b"", media_type="application/json")

    routes = [
        Route("/tool", tool, methods=["POST"]),
        Route("/evaluate", evaluate, methods=["POST"]),
        Route("/evaluate/batch", evaluate_batch, methods=["POST"]),
    ]
    if health is not None:
        routes.append(Route("/health", answer_health, methods=["GET"]))
    return Starlette(routes=routes)
