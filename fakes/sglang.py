"""A fake SGLang server for rollout tests: plays scripted turns through /generate, token in and
token out, with SGLang's response format (text, meta_info.output_token_logprobs as
[logprob, token_id, None], finish_reason.type stop | length | abort), and records every request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


class ByteTokenizer:
    """One token per UTF-8 byte: exact, reversible, and enough to check every array."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def logprob_of(position: int) -> float:
    return -round(0.05 * (position % 9 + 1), 4)


@dataclass
class ScriptedTurn:
    text: str
    finish: str = "stop"  # stop | length | abort


@dataclass
class FakeSGLang:
    script: list[ScriptedTurn]
    requests: list[dict[str, Any]] = field(default_factory=list)
    on_request: Callable[[int], None] | None = None

    def app(self) -> Starlette:
        tokenizer = ByteTokenizer()

        async def generate(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.requests.append({**body, "routing_key": request.headers.get("x-smg-routing-key")})
            if self.on_request is not None:
                self.on_request(len(self.requests))
            turn = self.script.pop(0) if self.script else ScriptedTurn("", "abort")
            ids = tokenizer.encode(turn.text)
            finish = turn.finish
            limit = body["sampling_params"]["max_new_tokens"]
            if len(ids) > limit:
                ids, finish = ids[:limit], "length"
            if finish == "abort":
                ids = []
            pairs = [[logprob_of(i), token, None] for i, token in enumerate(ids)]
            text = tokenizer.decode(ids)
            meta = {
                "finish_reason": {"type": finish},
                "output_token_logprobs": pairs,
                "prompt_tokens": len(body["input_ids"]),
            }
            return Response(
                orjson.dumps({"text": text, "meta_info": meta}), media_type="application/json"
            )

        async def health(_: Request) -> Response:
            return Response(b"{}", media_type="application/json")

        return Starlette(
            routes=[Route("/generate", generate, methods=["POST"]), Route("/health", health)]
        )
