"""New connections are accepted while the event loop is busy: a server whose every loop pass
takes 50 ms (a task that blocks, as a saturated server's passes do) takes 64 new clients in
about one pass, not one per pass (uvloop's own listener took one connection per pass: 64 x
50 ms = 3.2 s; see services/accepting.py)."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from services.serve import bind, start_server_thread

CLIENTS = 64
PASS_S = 0.05


def busy_app() -> Starlette:
    async def hello(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async def hog() -> None:
            while True:
                time.sleep(PASS_S)  # noqa: ASYNC251  # blocks the loop: each pass lasts PASS_S
                await asyncio.sleep(0)

        task = asyncio.create_task(hog())
        yield
        task.cancel()

    return Starlette(routes=[Route("/", hello)], lifespan=lifespan)


@contextmanager
def served() -> Iterator[int]:
    sock = bind("127.0.0.1", 0)
    port: int = sock.getsockname()[1]
    stop = start_server_thread(busy_app(), sock)
    try:
        yield port
    finally:
        stop()


async def first_bytes(port: int) -> list[float]:
    async def one() -> float:
        started = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await reader.read(1)
        writer.close()
        return time.perf_counter() - started

    return list(await asyncio.gather(*(one() for _ in range(CLIENTS))))


def test_a_busy_loop_accepts_every_waiting_connection_at_once() -> None:
    with served() as port:
        times = asyncio.run(first_bytes(port))
    # Accepted in one pass, read in the next, answered in the one after: a few passes, whatever
    # the number of clients. One accept per pass would need CLIENTS passes (3.2 s).
    assert max(times) < 12 * PASS_S, sorted(times)[-5:]


def test_the_listening_socket_is_closed_at_shutdown() -> None:
    with served() as port, socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    refused = False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        refused = True
    assert refused
