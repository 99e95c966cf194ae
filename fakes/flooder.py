"""Peers that hold idle connections: from each source address, `hold` sockets that never send a
byte, each re-opened as soon as the server closes it (a refusal, or its header timeout). What a
cluster's rollout workers look like to a service when each keeps a big idle pool: every worker
is another address (issue 27: two such addresses filled a tool server's whole cap).

Run: python -m fakes.flooder --port 8200 --sources 127.0.0.2,127.0.0.3 --hold 2100
     [--seconds 40] [--pause 0]

Linux routes all of 127/8 to the loopback interface, so 127.0.0.2 .. 127.0.0.9 are distinct
client addresses of one machine. Prints `flooding` once every socket has tried its first
connect; runs until `--seconds` have passed, or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import socket
import sys
import time


async def hold(source: str, target: tuple[str, int], pause_s: float, first: asyncio.Event) -> None:
    """One idle connection after another: connect from `source`, wait for the server to close."""
    loop = asyncio.get_running_loop()
    while True:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((source, 0))
            await loop.sock_connect(sock, target)
            first.set()
            await loop.sock_recv(sock, 1)
        except OSError:
            first.set()
            await asyncio.sleep(0.05)  # refused at connect (a full accept queue): not a spin
        finally:
            sock.close()
        if pause_s:
            await asyncio.sleep(pause_s)


async def flood(sources: list[str], target: tuple[str, int], count: int, pause_s: float) -> None:
    firsts = [asyncio.Event() for _ in range(count * len(sources))]
    tasks = [
        asyncio.create_task(hold(source, target, pause_s, firsts[i * count + k]))
        for i, source in enumerate(sources)
        for k in range(count)
    ]
    for event in firsts:
        await event.wait()
    print("flooding", flush=True)
    await asyncio.gather(*tasks)


def raise_open_files(need: int) -> None:
    """Each held socket is a file descriptor: the soft limit up to the hard one if short."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def run(args: argparse.Namespace) -> None:
    sources = args.sources.split(",")
    target = (args.host, args.port)
    task = asyncio.create_task(flood(sources, target, args.hold, args.pause))
    with contextlib.suppress(TimeoutError):  # the flood's time is up
        await asyncio.wait_for(task, args.seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sources", default="127.0.0.2", help="comma-separated source addresses")
    parser.add_argument("--hold", type=int, default=2100, help="sockets per source address")
    parser.add_argument("--seconds", type=float, default=3600.0)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds before a re-open")
    args = parser.parse_args()
    raise_open_files(args.hold * len(args.sources.split(",")) + 64)
    started = time.monotonic()
    asyncio.run(run(args))
    print(f"stopped after {time.monotonic() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
