"""Instant fake SGLang (/generate) and tool server (/tool, and /health as ours answers it, since
the rollout checks it) for the rollout benchmark and tests, as one bare ASGI app (no framework:
the fakes must not be what is measured). Each session searches `turns - 1` times, then finishes.

Run: python -m fakes.rollout_servers --port 9200 --turns 16
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from typing import Any

import orjson

from fakes.serving import serve_fake

SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "orrery"}}</tool_call>'
FINISH = '<tool_call>{"name": "finish", "arguments": {"answer": "Ilse Varen"}}</tool_call>'
OBSERVATION = orjson.dumps(
    {
        "output": "【1】Orrery\nhttps://o.example/\nA model.",
        "observation": "【1】Orrery\nhttps://o.example/\nA model.",
    }
)

HEALTH = orjson.dumps({"status": "ok"})


def generation(text: str) -> bytes:
    ids = list(text.encode())
    pairs = [[-0.1, token, None] for token in ids]
    return orjson.dumps(
        {
            "text": text,
            "meta_info": {"finish_reason": {"type": "stop"}, "output_token_logprobs": pairs},
        }
    )


def create_app(turns: int) -> Any:
    seen: defaultdict[bytes, int] = defaultdict(int)
    search, finish = generation(SEARCH), generation(FINISH)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:  # drain the body
            message = await receive()
            more = message.get("more_body", False)
        path = scope["path"]
        if path == "/generate":
            key = dict(scope["headers"]).get(b"x-smg-routing-key", b"")
            seen[key] += 1
            body = finish if seen[key] >= turns else search
        elif path == "/tool":
            body = OBSERVATION
        elif path == "/health":
            body = HEALTH
        else:
            body = b"{}"
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--turns", type=int, default=16)
    args = parser.parse_args()
    serve_fake(create_app(args.turns), args.port)


if __name__ == "__main__":
    main()
