"""One peer holding many idle connections against another client's searches and /health.

    python -m benchmarks.connection_flood [--tree PATH] [--seconds 40] [--idle 4200]

A tool server (one process, INFO logs, a service token) from TREE (default: this checkout);
from 127.0.0.2, `--idle` connections that never send a byte, each re-opened as soon as the
server closes it (a refusal, or the header timeout); from 127.0.0.1, a search and a /health
every 0.1 s, with the token. Prints how many of each failed, and the server's log lines by
event. (docs/services.md: 4,200 idle connections against the connection cap.)
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson

from benchmarks.baseline import ROOT
from benchmarks.harness import free_port, wait_healthy

TOKEN = "flood-benchmark-token"  # a throwaway token for a loopback server
FLOODER = "127.0.0.2"


async def hold(port: int, until: float) -> None:
    """One idle connection after another until `until`: connect, wait for the server to close."""
    loop = asyncio.get_running_loop()
    while time.monotonic() < until:
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((FLOODER, 0))
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            await asyncio.wait_for(loop.sock_recv(sock, 1), until - time.monotonic())
        except (OSError, TimeoutError):
            await asyncio.sleep(0.05)
        finally:
            sock.close()


def flood(port: int, idle: int, seconds: float) -> None:
    async def main() -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(*(hold(port, until) for _ in range(idle)))

    asyncio.run(main())


async def real_client(port: int, seconds: float) -> Counter[str]:
    outcomes: Counter[str] = Counter()
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
                try:
                    ok = (await call).status_code == 200
                except httpx.HTTPError:
                    ok = False
                outcomes[f"{kind} {'ok' if ok else 'failed'}"] += 1
            await asyncio.sleep(0.1)
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--idle", type=int, default=4200)
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
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(f"http://127.0.0.1:{port}/health")
            flooder = multiprocessing.get_context("fork").Process(
                target=flood, args=(port, args.idle, args.seconds + 2)
            )
            flooder.start()
            time.sleep(2)  # the flood first
            outcomes = asyncio.run(real_client(port, args.seconds))
            flooder.join()
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
    print(f"server log: {len(lines)} lines; by event: {dict(events.most_common(6))}")


if __name__ == "__main__":
    main()
