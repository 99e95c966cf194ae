"""Tool server throughput and added latency, and what the cache saves on a GRPO group.

Layout on a 2-core machine: the tool server alone on core 0; the fake upstream (fixed latency)
and the load generator (wrk) on core 1. Each concurrent session is one wrk connection.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.harness import (
    add_latency_over,
    free_port,
    pinned,
    process,
    python_module,
    run_wrk,
)

UPSTREAM_LATENCY_S = 0.05
SESSIONS = (64, 256, 1024)
GROUP_SIZE = 8
SHARED_QUERIES = ("orrery of haldor", "ilse varen clockmaker", "vorn valley museum")
OWN_QUERIES_PER_SAMPLE = 2


BIG_PAGE_URL = "https://bench.example/big"
BIG_PAGE_PIECES = 700_000  # "wordN text" pieces: ~9.6 MB of text
REOPENS = 20
FORBIDDEN_QUESTION = " ".join(f"forbidden{i}" for i in range(40))


def write_corpus(path: Path) -> None:
    docs = [
        {
            "url": f"https://bench.example/{i}",
            "title": f"Document {i}",
            "text": f"Text of document {i} about orreries.",
        }
        for i in range(200)
    ]
    big = " ".join(f"word{i % 5000} text" for i in range(BIG_PAGE_PIECES))
    docs.append({"url": BIG_PAGE_URL, "title": "Big page", "text": big})
    path.write_bytes(b"\n".join(orjson.dumps(d) for d in docs) + b"\n")


def tool_server_command(
    port: int,
    upstream: str,
    corpus: Path,
    cache_dir: Path,
    *extra: str,
    workers: bool = True,
    config_options: bool = True,
) -> list[str]:
    """The benchmark's tool server; `workers=False` for a tree older than `--workers`,
    `config_options=False` for one older than the options generated from ToolServerConfig
    (`--serper.base-url` was `--serper-url`)."""
    one_process = ["--workers", "1"] if workers else []  # its pid's CPU is what is measured
    if config_options:
        upstream_options = ["--serper.base-url", upstream, "--serper.max-concurrency", "1024"]
        cache = ["--index-cache-dir", str(cache_dir)]
    else:
        upstream_options = ["--serper-url", upstream, "--max-concurrency", "1024"]
        cache = ["--index-cache", str(cache_dir)]
    return python_module(
        "slurm.cli",
        "serve",
        "tools",
        "--port",
        str(port),
        "--search",
        "serper",
        *upstream_options,
        "--reader",
        "offline",
        "--corpus",
        str(corpus),
        *cache,
        *one_process,
        *extra,
    )


# no caching, no collapsing of identical calls: every call upstream
NO_CACHE = ("--search-cache.enabled", "false", "--page-cache.enabled", "false")


def run_load(
    server_pid: int,
    base: str,
    upstream: str,
    mode: str,
    sessions: int,
    seconds: int,
    think_ms: int = 0,
) -> dict[str, Any]:
    """One load run, plus the number of calls that reached the upstream during it."""
    before = httpx.get(f"{upstream}/stats").json()["calls"]
    result = run_wrk(server_pid, f"{base}/tool", f"tool-{mode}", sessions, seconds, think_ms)
    time.sleep(1)  # let calls still in flight reach the upstream before counting
    result["upstream_calls"] = httpx.get(f"{upstream}/stats").json()["calls"] - before
    return result


async def replay_group(base: str, upstream: str) -> int:
    """8 samples of one prompt: the same 3 first searches at once, then 2 searches of their own."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        await client.post(f"{upstream}/reset")

        async def sample(k: int) -> None:
            for query in SHARED_QUERIES:
                await client.post(
                    "/tool",
                    json={"session_id": f"g-{k}", "name": "search", "arguments": {"query": query}},
                )
            for j in range(OWN_QUERIES_PER_SAMPLE):
                query = f"sample {k} follow-up {j}"
                await client.post(
                    "/tool",
                    json={"session_id": f"g-{k}", "name": "search", "arguments": {"query": query}},
                )

        await asyncio.gather(*(sample(k) for k in range(GROUP_SIZE)))
        calls: int = (await client.get(f"{upstream}/stats")).json()["calls"]
        return calls


async def reopen_big_page(base: str) -> dict[str, float]:
    """Re-open page 2 of a cached ~9.6 MB page (with a 40-word forbidden question, so the
    leakage filter runs) while another client polls /health: what one large page costs the
    sessions that share the server's event loop."""
    body = {
        "session_id": "big",
        "name": "open",
        "arguments": {"url": BIG_PAGE_URL, "page": 2},
        "remote_env_info": {"forbidden_texts": [FORBIDDEN_QUESTION]},
    }
    opens: list[float] = []
    health: list[float] = []
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        await client.post("/tool", json=body)  # fetch and cache it
        done = asyncio.Event()

        async def poll_health() -> None:
            while not done.is_set():
                started = time.perf_counter()
                await client.get("/health")
                health.append(time.perf_counter() - started)
                await asyncio.sleep(0.005)

        poller = asyncio.create_task(poll_health())
        for _ in range(REOPENS):
            started = time.perf_counter()
            await client.post("/tool", json=body)
            opens.append(time.perf_counter() - started)
        done.set()
        await poller
    return {
        "reopen_p50_ms": round(statistics.median(opens) * 1000, 1),
        "health_p50_ms": round(statistics.median(health) * 1000, 1),
        "health_max_ms": round(max(health) * 1000, 1),
    }


def run(seconds: int = 8) -> dict[str, Any]:
    if shutil.which("wrk") is None:
        raise RuntimeError("the tool-server benchmark needs wrk (apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus.jsonl"
        write_corpus(corpus)
        env = {**os.environ, "SERPER_API_KEY": "bench-key-not-secret"}
        env.pop("DEEPDIVE_SERVICE_TOKEN", None)
        up_port, cached_port, uncached_port = free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        fake = pinned(
            python_module(
                "fakes.upstream",
                "--port",
                str(up_port),
                "--latency",
                str(UPSTREAM_LATENCY_S),
            ),
            core=1,
        )
        cached = pinned(tool_server_command(cached_port, upstream, corpus, work / "idx"), core=0)
        uncached = pinned(
            tool_server_command(uncached_port, upstream, corpus, work / "idx", *NO_CACHE), core=0
        )
        results: dict[str, Any] = {"upstream_latency_ms": UPSTREAM_LATENCY_S * 1000, "runs": []}
        with process(fake, f"{upstream}/stats", work / "fake.log"):
            # The group replays run first, on fresh servers: a load run leaves upstream calls
            # in flight (they finish and fill the cache even after wrk hangs up).
            with process(
                uncached, f"http://127.0.0.1:{uncached_port}/health", work / "uncached.log", env
            ):
                base = f"http://127.0.0.1:{uncached_port}"
                results["group_calls_without_cache"] = asyncio.run(replay_group(base, upstream))
            with process(
                cached, f"http://127.0.0.1:{cached_port}/health", work / "cached.log", env
            ) as server:
                base = f"http://127.0.0.1:{cached_port}"
                results["group_calls_with_cache"] = asyncio.run(replay_group(base, upstream))
                results["big_page"] = asyncio.run(reopen_big_page(base))
                httpx.post(
                    f"{base}/tool",
                    json={
                        "session_id": "warm",
                        "name": "search",
                        "arguments": {"query": "silver orrery of haldor"},
                    },
                )
                for sessions in SESSIONS:
                    for mode in ("hit", "miss"):
                        results["runs"].append(
                            run_load(server.pid, base, upstream, mode, sessions, seconds)
                        )
                # Below saturation: 64 sessions that think between calls, as agents do.
                results["runs"].append(
                    run_load(server.pid, base, upstream, "miss", 64, seconds, think_ms=200)
                )
        results["group_distinct_queries"] = (
            len(SHARED_QUERIES) + GROUP_SIZE * OWN_QUERIES_PER_SAMPLE
        )
        for run_result in results["runs"]:
            if run_result["mode"].startswith("tool-miss"):
                add_latency_over(run_result, UPSTREAM_LATENCY_S)
        return results
