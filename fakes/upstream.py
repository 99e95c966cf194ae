"""Fake paid upstreams with a fixed latency, counting calls and peak concurrency:
a Serper-compatible search API (POST /search) and an OpenAI-compatible judge
(POST /v1/chat/completions, which grades "Paris" correct and anything else wrong).

With `fail_share`, that share of the search calls fail with Serper's 503, spread evenly over
the calls in order (0.6: calls 2, 4, 5 of every five): a search API that is mostly down.

Run: python -m fakes.upstream --port 9100 --latency 0.05 [--fail-share 0.6]
"""

from __future__ import annotations

import argparse
import asyncio

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fakes.serving import serve_fake

# Result links point at https://bench.example/0 .. /199, the tool-server benchmark's corpus.
CORPUS_PAGES = 200


def create_app(latency_s: float, fail_share: float = 0.0) -> Starlette:
    calls: list[str] = []
    concurrency = {"active": 0, "peak": 0}

    async def judge(request: Request) -> Response:
        prompt = orjson.loads(await request.body())["messages"][0]["content"]
        calls.append(prompt)
        concurrency["active"] += 1
        concurrency["peak"] = max(concurrency["peak"], concurrency["active"])
        try:
            await asyncio.sleep(latency_s)
        finally:
            concurrency["active"] -= 1
        verdict = "yes" if "[response]: Paris\n" in prompt else "no"
        content = f"extracted_final_answer: x\n\nreasoning: fake\n\ncorrect: {verdict}"
        body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
        return Response(orjson.dumps(body), media_type="application/json")

    async def search(request: Request) -> Response:
        query = orjson.loads(await request.body())["q"]
        calls.append(query)
        n = len(calls)  # this call's number, before another call can arrive
        await asyncio.sleep(latency_s)
        if int(n * fail_share) > int((n - 1) * fail_share):
            unavailable = {"message": "Service temporarily unavailable", "statusCode": 503}
            return Response(orjson.dumps(unavailable), 503, media_type="application/json")
        organic = [
            {
                "title": f"{query} result {i}",
                # pages of the benchmark's offline corpus, so a click on a result opens
                "link": f"https://bench.example/{(len(calls) + i) % CORPUS_PAGES}",
                "snippet": f"about {query}",
                "position": i,
            }
            for i in range(1, 11)
        ]
        # Serper repeats the query it answers (services/client/http.py echoed_query checks it)
        body = {"searchParameters": {"q": query}, "organic": organic}
        return Response(orjson.dumps(body), media_type="application/json")

    async def stats(_: Request) -> Response:
        return Response(
            orjson.dumps(
                {
                    "calls": len(calls),
                    "distinct": len(set(calls)),
                    "peak_concurrency": concurrency["peak"],
                }
            ),
            media_type="application/json",
        )

    async def reset(_: Request) -> Response:
        calls.clear()
        concurrency["peak"] = concurrency["active"]
        return Response(b"{}", media_type="application/json")

    return Starlette(
        routes=[
            Route("/search", search, methods=["POST"]),
            Route("/v1/chat/completions", judge, methods=["POST"]),
            Route("/stats", stats, methods=["GET"]),
            Route("/reset", reset, methods=["POST"]),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--fail-share", type=float, default=0.0)
    args = parser.parse_args()
    serve_fake(create_app(args.latency, args.fail_share), args.port)


if __name__ == "__main__":
    main()
