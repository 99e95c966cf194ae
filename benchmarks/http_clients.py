"""The HTTP clients side by side: CPU per request of each client the project could use, at the
rollout's and the tool server's operating points, against one instant fake server.

    python -m benchmarks.http_clients [--rounds 3] [--requests 4096]

Clients: aiohttp (what `Upstream` uses for everything that leaves the cluster), httpx2 (the
maintained httpx successor; its pool was rewritten after httpx's per-request scan of every
connection, which cost ~17 ms of CPU a request at 64 concurrent here), and the lean client
(services/client/plain_http.py, `Upstream(plain_http=True)`, the rollout's plain http:// hops). Each
measurement runs in a fresh process pinned to core 0 (the fake on core 1): N concurrent
sessions, each POSTing a small JSON body and reading the reply, K times; the figure is the
client process's CPU over the requests. Rounds alternate the clients, so the machine's drift
falls on all of them; the medians and their ratios to aiohttp are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import free_port, pinned, process, python_module

CLIENTS = ("aiohttp", "httpx2", "lean")
CONCURRENCY = (64, 256)


async def _sessions(call: Any, sessions: int, requests: int) -> None:
    async def session(number: int) -> None:
        body = {"session_id": f"s{number}", "name": "search", "arguments": {"query": "orrery"}}
        for _ in range(max(1, requests // sessions)):
            await call(body)

    await asyncio.gather(*(session(number) for number in range(sessions)))


async def measure(client: str, base: str, sessions: int, requests: int) -> dict[str, Any]:
    """One client's CPU per request (ms), after a warm-up of one request per session."""
    import orjson

    if client == "httpx2":
        import httpx2

        limits = httpx2.Limits(max_connections=sessions, max_keepalive_connections=sessions)
        async with httpx2.AsyncClient(base_url=base, limits=limits, trust_env=False) as http:

            async def call(body: dict[str, Any]) -> None:
                reply = await http.post("/tool", content=orjson.dumps(body))
                reply.raise_for_status()
                orjson.loads(reply.content)

            return await _timed(call, sessions, requests)
    from services.client.http import Upstream, UpstreamSettings
    from services.client.retries import RetryPolicy

    settings = UpstreamSettings(
        base,
        max_concurrency=sessions,
        retry=RetryPolicy(max_attempts=1),
        plain_http=client == "lean",
    )
    upstream = Upstream("bench", settings)

    async def send(body: dict[str, Any]) -> None:
        reply = await upstream.send("POST", "/tool", json=body)
        orjson.loads(reply.content)

    try:
        return await _timed(send, sessions, requests)
    finally:
        await upstream.aclose()


async def _timed(call: Any, sessions: int, requests: int) -> dict[str, Any]:
    await _sessions(call, sessions, sessions)  # warm-up: connections, imports, caches
    started, cpu = time.perf_counter(), time.process_time()
    await _sessions(call, sessions, requests)
    elapsed, used = time.perf_counter() - started, time.process_time() - cpu
    done = sessions * max(1, requests // sessions)
    return {"cpu_ms": round(used * 1000 / done, 4), "per_s": round(done / elapsed, 1)}


def child(client: str, base: str, sessions: int, requests: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    import uvloop

    print(json.dumps(uvloop.run(measure(client, base, sessions, requests))), flush=True)


def run(rounds: int = 3, requests: int = 4096) -> dict[str, Any]:
    results: dict[str, dict[str, list[float]]] = {
        f"{client}@{n}": {"cpu_ms": [], "per_s": []} for client in CLIENTS for n in CONCURRENCY
    }
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        fake = pinned(python_module("fakes.rollout_servers", "--port", str(port)), core=1)
        with process(fake, f"{base}/health", Path(tmp) / "fake.log"):
            for number in range(rounds):
                order = CLIENTS if number % 2 == 0 else tuple(reversed(CLIENTS))
                for sessions in CONCURRENCY:
                    for client in order:
                        output = subprocess.run(
                            [sys.executable, "-m", "benchmarks.http_clients", "--child",
                             client, base, str(sessions), str(requests)],
                            capture_output=True, text=True, check=True, timeout=600,
                        ).stdout  # fmt: skip
                        figures = json.loads(output)
                        for key in ("cpu_ms", "per_s"):
                            results[f"{client}@{sessions}"][key].append(figures[key])
    summary: dict[str, Any] = {}
    for name, figures in results.items():
        reference = statistics.median(results[f"aiohttp@{name.split('@')[1]}"]["cpu_ms"])
        cpu = statistics.median(figures["cpu_ms"])
        summary[name] = {
            "cpu_ms_per_request": cpu,
            "cpu_ms_each": figures["cpu_ms"],
            "requests_per_s": statistics.median(figures["per_s"]),
            "cpu_vs_aiohttp": round(cpu / reference, 2),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=4, metavar=("CLIENT", "BASE", "SESSIONS", "REQUESTS"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4096)
    args = parser.parse_args()
    if args.child:
        client, base, sessions, requests = args.child
        child(client, base, int(sessions), int(requests))
        return
    summary = run(args.rounds, args.requests)
    print(f"{'client':<10} {'sessions':>8} {'CPU ms/request':>15} {'x aiohttp':>10} {'req/s':>9}")
    for name, row in summary.items():
        client, count = name.split("@")
        print(
            f"{client:<10} {count:>8} {row['cpu_ms_per_request']:>15.4f} "
            f"{row['cpu_vs_aiohttp']:>10.2f} {row['requests_per_s']:>9.1f}"
        )


if __name__ == "__main__":
    main()
