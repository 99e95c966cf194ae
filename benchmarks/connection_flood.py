"""Addresses holding many idle connections against another client's searches and /health.

    python -m benchmarks.connection_flood [--tree PATH] [--seconds 40] [--addresses 2]
                                          [--idle 2100]

A tool server (one process, INFO logs, a service token) from TREE (default: this checkout);
from each of `--addresses` addresses (127.0.0.2, 127.0.0.3, ...), `--idle` connections that
never send a byte, each re-opened as soon as the server closes it (a refusal, or the header
timeout: fakes/flooder.py); from 127.0.0.1, a search and a /health every 0.1 s, with the token,
a new connection each. Prints how many of each failed, /health's latency, and the server's log
lines by event. (docs/services.md: addresses holding more than the connection cap.)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson

from benchmarks.baseline import ROOT
from benchmarks.harness import free_port, python_module, wait_healthy

TOKEN = "flood-benchmark-token"  # a throwaway token for a loopback server


async def real_client(port: int, seconds: float) -> tuple[Counter[str], list[float]]:
    """Outcomes by kind, and each answered /health's seconds."""
    outcomes: Counter[str] = Counter()
    health_s: list[float] = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    base = f"http://127.0.0.1:{port}"
    limits = httpx.Limits(max_keepalive_connections=0)  # a new connection every call
    async with httpx.AsyncClient(timeout=5, limits=limits, trust_env=False) as client:
        until = time.monotonic() + seconds
        number = 0
        while time.monotonic() < until:
            number += 1
            body = {"session_id": f"s{number}", "name": "search", "arguments": {"query": "orrery"}}
            for kind, call in (
                ("search", client.post(f"{base}/tool", headers=headers, json=body)),
                ("health", client.get(f"{base}/health")),
            ):
                started = time.monotonic()
                try:
                    ok = (await call).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok and kind == "health":
                    health_s.append(time.monotonic() - started)
                outcomes[f"{kind} {'ok' if ok else 'failed'}"] += 1
            await asyncio.sleep(0.1)
    return outcomes, health_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--addresses", type=int, default=2, help="flooding addresses, 1-250")
    parser.add_argument("--idle", type=int, default=2100, help="idle connections per address")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="deepdive-flood-"))
    corpus = work / "corpus.jsonl"
    docs = [
        {"url": f"https://x.example/{i}", "title": f"Doc {i}", "text": f"orrery {i}"}
        for i in range(50)
    ]
    corpus.write_bytes(b"\n".join(orjson.dumps(doc) for doc in docs) + b"\n")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(args.tree), "DEEPDIVE_SERVICE_TOKEN": TOKEN}
    command = [sys.executable, "-m", "services", "tools", "--port", str(port), "--workers", "1",
               "--corpus", str(corpus), "--index-cache", "false", "--log-level", "INFO"]  # fmt: skip
    log_path = work / "server.log"
    with log_path.open("wb") as log:
        # cwd: `-m` puts the working directory first on sys.path, ahead of PYTHONPATH
        server = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=args.tree
        )
        try:
            wait_healthy(f"http://127.0.0.1:{port}/health")
            sources = ",".join(f"127.0.0.{2 + i}" for i in range(args.addresses))
            flood = subprocess.Popen(
                python_module("fakes.flooder", "--port", str(port), "--sources", sources,
                              "--hold", str(args.idle), "--seconds", str(args.seconds + 5)),
                stdout=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(2)  # the flood first
            outcomes, health_s = asyncio.run(real_client(port, args.seconds))
            flood.terminate()
            flood.wait(timeout=30)
        finally:
            server.terminate()
            server.wait(timeout=30)
    events: Counter[str] = Counter()
    lines = log_path.read_text(errors="replace").splitlines()
    for line in lines:
        parts = line.split()
        if len(parts) > 4 and parts[2] in ("INFO", "WARNING", "ERROR"):
            events[parts[4]] += 1
    for kind in ("search", "health"):
        ok, failed = outcomes[f"{kind} ok"], outcomes[f"{kind} failed"]
        print(f"{kind}: {ok} answered, {failed} failed ({failed / max(1, ok + failed):.0%})")
    if health_s:
        ordered = sorted(health_s)
        p50, p99 = (
            ordered[len(ordered) // 2],
            ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)],
        )
        print(f"/health answered in: p50 {p50:.3f} s, p99 {p99:.3f} s, max {ordered[-1]:.3f} s")
    print(f"server log: {len(lines)} lines; by event: {dict(events.most_common(6))}")


if __name__ == "__main__":
    main()
