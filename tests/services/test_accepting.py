"""New connections are accepted while the event loop is busy: a server whose every loop pass
takes 50 ms (a task that blocks, as a saturated server's passes do) takes 64 new clients in
about one pass, not one per pass (uvloop's own listener took one connection per pass: 64 x
50 ms = 3.2 s; see services/serving/accepting.py). And a new session's first call costs one loop pass
more than a call on an open connection, not two."""

from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from services.serving.accepting import EagerAcceptServer, _connect_now
from services.serving.serve import bind, start_server_thread

CLIENTS = 64
PASS_S = 0.05


def busy_app(pass_s: float = PASS_S, passes: list[int] | None = None) -> Starlette:
    """A server whose every loop pass lasts pass_s; `passes[0]` counts them."""
    counter = passes if passes is not None else [0]

    async def hello(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        async def hog() -> None:
            while True:
                time.sleep(pass_s)  # noqa: ASYNC251  # blocks the loop: each pass lasts pass_s
                counter[0] += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(hog())
        yield
        task.cancel()

    return Starlette(routes=[Route("/", hello)], lifespan=lifespan)


@contextmanager
def served(app: Starlette | None = None) -> Iterator[int]:
    sock = bind("127.0.0.1", 0)
    port: int = sock.getsockname()[1]
    stop = start_server_thread(app or busy_app(), sock)
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
    # the number of clients (~0.16 s here). One accept per pass would need CLIENTS passes
    # (3.2 s); the bound leaves a loaded machine room and still tells the two apart.
    assert max(times) < 20 * PASS_S, sorted(times)[-5:]


def test_the_listening_socket_is_closed_at_shutdown() -> None:
    with served() as port, socket.create_connection(("127.0.0.1", port), timeout=5):
        pass
    refused = False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        refused = True
    assert refused


class WatchedSocket(socket.socket):
    """A real listening socket that notes what its server had announced when listen() came."""

    server: EagerAcceptServer
    announced_at_listen: tuple[bool, bool] | None = None

    def listen(self, backlog: int = socket.SOMAXCONN) -> None:
        self.announced_at_listen = (self.server.started, self.server.accepting.is_set())
        super().listen(backlog)


def test_the_server_says_it_accepts_only_once_its_socket_listens() -> None:
    """uvicorn marks itself `started` before these sockets listen, so a thread that waited on
    `started` could connect and be refused (the container CI did once). `accepting` is the
    signal start_server_thread waits on: never set before listen()."""
    sock = WatchedSocket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = EagerAcceptServer(uvicorn.Config(Starlette(), log_config=None, lifespan="on"))
    sock.server = server
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert server.accepting.wait(10)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        started, accepting = sock.announced_at_listen or (None, None)
        assert accepting is False
        assert started is True  # uvicorn's own flag is early: why `accepting` exists
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def test_start_server_thread_returns_a_listening_server() -> None:
    sock = bind("127.0.0.1", 0)
    stop = start_server_thread(Starlette(), sock)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
    finally:
        stop()


async def passes_per_call(port: int, passes: list[int], calls: int) -> tuple[float, float]:
    """Loop passes until the first byte: of a new connection's first call, and of a call on a
    connection already open (the mean of each over `calls`)."""
    open_reader, open_writer = await asyncio.open_connection("127.0.0.1", port)
    new, existing = [], []
    for _ in range(calls):
        await asyncio.sleep(0.013)  # somewhere inside a pass, not at its edge
        before = passes[0]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await reader.read(1)
        writer.close()
        new.append(passes[0] - before)
        before = passes[0]
        open_writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await open_reader.readuntil(b"ok")
        existing.append(passes[0] - before)
    open_writer.close()
    return statistics.mean(new), statistics.mean(existing)


def test_a_new_connection_costs_one_pass_more_than_an_open_one() -> None:
    """Accepted in a pass, connection_made in the next (uvloop schedules it), then read and
    answered as any call: one pass more. Started as a task, connect_accepted_socket would
    start a pass later still (4 passes against ~2; a saturated pass is ~0.3 s)."""
    passes = [0]
    with served(busy_app(0.02, passes)) as port:
        new, existing = asyncio.run(passes_per_call(port, passes, 30))
    assert new - existing <= 1.5, (new, existing)


def test_the_connect_driver_finishes_or_closes_whatever_the_coroutine_does() -> None:
    """_connect_now drives the loop's connect coroutine by hand: every way it can go ends with
    the coroutine finished and the socket kept only when the connection was made."""

    async def scenarios() -> dict[str, bool]:
        loop = asyncio.get_running_loop()
        outcome: dict[str, bool] = {}
        done: dict[str, bool] = {}

        def case() -> socket.socket:
            mine, theirs = socket.socketpair()
            theirs.close()
            return mine

        async def returns_at_once() -> None:
            done["at_once"] = True

        async def awaits(future: asyncio.Future[None], name: str) -> None:
            await future
            await asyncio.sleep(0)  # then a bare yield
            done[name] = True

        async def fails() -> None:
            raise ConnectionResetError("gone")

        socks = {name: case() for name in ("at_once", "ok", "failed", "raises")}
        ok: asyncio.Future[None] = loop.create_future()
        failed: asyncio.Future[None] = loop.create_future()
        _connect_now(returns_at_once(), socks["at_once"])
        _connect_now(awaits(ok, "ok"), socks["ok"])
        _connect_now(awaits(failed, "failed"), socks["failed"])
        _connect_now(fails(), socks["raises"])
        loop.call_later(0.01, ok.set_result, None)
        loop.call_later(0.01, failed.set_exception, ConnectionResetError("reset"))
        await asyncio.sleep(0.1)
        for name, sock in socks.items():
            outcome[name] = sock.fileno() != -1  # still open
            sock.close()
        outcome["finished"] = done == {"at_once": True, "ok": True}
        return outcome

    assert asyncio.run(scenarios()) == {
        "at_once": True,
        "ok": True,
        "failed": False,
        "raises": False,
        "finished": True,
    }
