"""New sessions arriving at a saturated server: how long until their first call answers.

    python -m benchmarks.accept_probe URL SECONDS WAVE INTERVAL_S [BURST]

Every INTERVAL_S, WAVE new connections open at once; each sends one search (of a query the
server has cached, so the upstream's latency is not in it) and times connect -> first byte of
the answer. BURST more open at the start, all at once (sessions arriving with the load's own:
wrk opens its connections at the same moment). Prints one JSON line: the times in ms, the
burst's apart. Run it while wrk holds the server busy.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from urllib.parse import urlsplit

BODY = b'{"session_id":"probe","name":"search","arguments":{"query":"silver orrery of haldor"}}'


async def first_byte(host: str, port: int, timeout_s: float) -> float:
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (TimeoutError, OSError):
        return float("inf")
    request = (
        f"POST /tool HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\nConnection: close\r\n\r\n"
    ).encode() + BODY
    try:
        writer.write(request)
        await asyncio.wait_for(reader.read(1), timeout_s)
        return (time.perf_counter() - started) * 1000
    except (TimeoutError, OSError):
        return float("inf")
    finally:
        writer.close()


async def probe(
    url: str, seconds: float, wave: int, interval_s: float, burst: int = 0
) -> tuple[list[float], list[float]]:
    """The waves' times and the burst's."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    burst_tasks = [asyncio.create_task(first_byte(host, port, 30.0)) for _ in range(burst)]
    pending: list[asyncio.Task[float]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pending += [asyncio.create_task(first_byte(host, port, 30.0)) for _ in range(wave)]
        await asyncio.sleep(interval_s)
    return list(await asyncio.gather(*pending)), list(await asyncio.gather(*burst_tasks))


def main() -> None:
    url, seconds, wave, interval = sys.argv[1:5]
    burst = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    times, burst_times = asyncio.run(probe(url, float(seconds), int(wave), float(interval), burst))
    print(json.dumps({"first_byte_ms": times, "burst_first_byte_ms": burst_times}), flush=True)


if __name__ == "__main__":
    main()
