"""Instant fake SGLang (/generate) and tool server (/tool, and /health as ours answers it, since
the rollout checks it) for the rollout benchmark and tests, as one bare ASGI app (no framework:
the fakes must not be what is measured). Each session searches `turns - 1` times, then
finishes. The first `SHARED_SEARCHES` observations of every session are
the same text (a GRPO group's samples repeat each other's first searches); later ones differ
per session and turn, as results of a sample's own searches do.

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
SHARED_SEARCHES = 3
SHARED = "【1】Orrery\nhttps://o.example/\nA model."


def observation(text: str) -> bytes:
    return orjson.dumps({"output": text, "observation": text})


def own_observation(session: str, call: int) -> bytes:
    """Text of this session's own search: the session's name after its last "-" (the
    benchmark names sessions RUN-K, so equal K give equal samples from run to run)."""
    name = session.rpartition("-")[2]
    return observation(f"【1】Orrery {call}\nhttps://o.example/{name}/{call}\nA model.")


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
    tool_calls: defaultdict[str, int] = defaultdict(int)
    search, finish = generation(SEARCH), generation(FINISH)
    shared = observation(SHARED)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more, chunks = True, []
        while more:  # read the body
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        path = scope["path"]
        if path == "/generate":
            key = dict(scope["headers"]).get(b"x-smg-routing-key", b"")
            seen[key] += 1
            body = finish if seen[key] >= turns else search
        elif path == "/tool":
            session = str(orjson.loads(b"".join(chunks)).get("session_id"))
            tool_calls[session] += 1
            call = tool_calls[session]
            body = shared if call <= SHARED_SEARCHES else own_observation(session, call)
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
