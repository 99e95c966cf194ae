"""A fake SGLang server for rollout tests: plays scripted turns through /generate, token in and
token out, with SGLang's response format (text, meta_info.output_token_logprobs as
[logprob, token_id, None], finish_reason.type stop | length | abort), and records every request.

Asked for top-p token ids (`sampling_params.custom_params.return_top_p_token_ids`, as slime
asks with --rollout-top-p < 1), it returns `meta_info.top_p_token_ids` and
`top_p_token_offsets` as SGLang does, base64 of native int32 (or lists, `top_p_format`):
position i of a turn kept `kept_ids(token, i)`.

A scripted turn can also refuse the request as SGLang does (`status` 400 with its error body,
`{"error": {"message": ...}}`, python/sglang/srt/entrypoints/http_server.py), answer a router's
5xx, send any `body` at all, or abort with a `message` in `finish_reason`."""

from __future__ import annotations

import base64
from array import array
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


def kept_ids(token: int, position: int) -> list[int]:
    """The token ids SGLang's top-p kept at one position: the sampled one and 0-2 others."""
    return [token, *(1000 + token + k for k in range(position % 3))]


def _int32_base64(values: list[int]) -> str:
    return base64.b64encode(array("i", values).tobytes()).decode("ascii")


@dataclass
class ScriptedTurn:
    text: str
    finish: str = "stop"  # stop | length | abort
    status: int = 200  # anything else: an error reply, SGLang's shape unless `body` is given
    message: str = ""  # the error's message, or the abort's finish_reason.message
    body: bytes | None = None  # the reply's body exactly, for an error status


@dataclass
class FakeSGLang:
    script: list[ScriptedTurn]
    requests: list[dict[str, Any]] = field(default_factory=list)
    on_request: Callable[[int], None] | None = None
    top_p_format: str = "base64"  # base64 | list | missing (a reply that lacks them)
    # when set, each turn is chosen from the text so far (prompt and turns), not popped from
    # `script`: episodes played at once each follow their own script
    choose: Callable[[str], ScriptedTurn] | None = None
    # when set, the context SGLang serves, with its bounds: the scheduler aborts an input of
    # max_req_input_len = min(context - 1, pool - 1) - 5 tokens or more (the pool taken as
    # large), and the tokenizer manager refuses input + max_new_tokens over the context (400)
    context_length: int | None = None

    def app(self) -> Starlette:
        tokenizer = ByteTokenizer()

        async def generate(request: Request) -> Response:
            body = orjson.loads(await request.body())
            self.requests.append({**body, "routing_key": request.headers.get("x-smg-routing-key")})
            if self.on_request is not None:
                self.on_request(len(self.requests))
            refused = self._over_context(body)
            if refused is not None:
                return refused
            if self.choose is not None:
                turn = self.choose(tokenizer.decode(body["input_ids"]))
            else:
                turn = self.script.pop(0) if self.script else ScriptedTurn("", "abort")
            if turn.status != 200:
                error = orjson.dumps({"error": {"message": turn.message}})
                return Response(
                    error if turn.body is None else turn.body,
                    status_code=turn.status,
                    media_type="application/json",
                )
            ids = tokenizer.encode(turn.text)
            finish = turn.finish
            limit = body["sampling_params"]["max_new_tokens"]
            if len(ids) > limit:
                ids, finish = ids[:limit], "length"
            if finish == "abort":
                ids = []
            pairs = [[logprob_of(i), token, None] for i, token in enumerate(ids)]
            text = tokenizer.decode(ids)
            reason: dict[str, Any] = {"type": finish}
            if finish == "abort" and turn.message:
                reason["message"] = turn.message
            meta = {
                "finish_reason": reason,
                "output_token_logprobs": pairs,
                "prompt_tokens": len(body["input_ids"]),
            }
            custom = body["sampling_params"].get("custom_params") or {}
            if custom.get("return_top_p_token_ids") and self.top_p_format != "missing":
                spans = [kept_ids(token, i) for i, token in enumerate(ids)]
                flat = [token for span in spans for token in span]
                offsets = [0]
                for span in spans:
                    offsets.append(offsets[-1] + len(span))
                encode = _int32_base64 if self.top_p_format == "base64" else list
                meta["top_p_token_ids"] = encode(flat)
                meta["top_p_token_offsets"] = encode(offsets)
            return Response(
                orjson.dumps({"text": text, "meta_info": meta}), media_type="application/json"
            )

        async def health(_: Request) -> Response:
            return Response(b"{}", media_type="application/json")

        return Starlette(
            routes=[Route("/generate", generate, methods=["POST"]), Route("/health", health)]
        )

    def _over_context(self, body: dict[str, Any]) -> Response | None:
        """SGLang's answer to a request past `context_length`, or None when it is served."""
        if self.context_length is None:
            return None
        length = len(body["input_ids"])
        wanted = length + int(body["sampling_params"].get("max_new_tokens") or 0)
        if wanted > self.context_length:
            message = (
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.context_length} tokens. You requested a total of {wanted} tokens."
            )
            return Response(
                orjson.dumps({"error": {"message": message}}),
                status_code=400,
                media_type="application/json",
            )
        bound = self.context_length - 1 - 5
        if length < bound:
            return None
        message = (
            f"Input length ({length} tokens) exceeds the maximum allowed length ({bound} "
            "tokens). Use a shorter input or enable --allow-auto-truncate."
        )
        meta = {
            "finish_reason": {"type": "abort", "message": message},
            "output_token_logprobs": [],
            "prompt_tokens": length,
        }
        return Response(
            orjson.dumps({"text": "", "meta_info": meta}), media_type="application/json"
        )
