"""New connections waiting in the kernel's queue are all taken on one readiness of the listening
socket (services/serving/accepting.py), not one per pass of the event loop as uvloop's listener
took them: at 1,024 busy sessions a pass lasts a tenth of a second or more, and new sessions
waited seconds (issue 27). Measured in passes of the loop, not in seconds: a callback that
re-schedules itself counts the passes, and each connection's request reads the count."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from services.serving.serve import bind, start_server_thread

QUEUED = 64  # connections made while the loop is held up
WAIT_S = 30.0  # only for a broken server: nothing here waits on the clock otherwise


class PassCounter:
    """Counts the event loop's passes: `tick` runs once a pass and schedules itself again."""

    def __init__(self) -> None:
        self.passes = 0
        self.running = False

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.running = True
        loop.call_soon(self.tick, loop)

    def tick(self, loop: asyncio.AbstractEventLoop) -> None:
        self.passes += 1
        if self.running:
            loop.call_soon(self.tick, loop)


class HeldLoop:
    """An app whose `/hold` blocks its event loop until released (so the test's connections
    queue in the kernel meanwhile) and whose `/pass` answers the loop's pass count."""

    def __init__(self) -> None:
        self.counter = PassCounter()
        self.holding = threading.Event()
        self.release = threading.Event()
        self.app = Starlette(routes=[Route("/hold", self.hold), Route("/pass", self.current)])

    async def hold(self, request: Request) -> PlainTextResponse:
        self.counter.start(asyncio.get_running_loop())
        self.holding.set()
        self.release.wait(WAIT_S)  # blocks the loop on purpose: nothing is accepted meanwhile
        return PlainTextResponse("released")

    async def current(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse(str(self.counter.passes))


def get(port: int, path: str) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    conn.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n".encode())
    return conn


def body(conn: socket.socket) -> str:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    conn.close()
    head, _, text = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return text.decode()


@pytest.fixture
def held() -> Iterator[tuple[HeldLoop, int]]:
    app = HeldLoop()
    sock = bind("127.0.0.1", 0)
    stop = start_server_thread(app.app, sock)
    try:
        yield app, sock.getsockname()[1]
    finally:
        app.counter.running = False
        app.release.set()
        stop()


def test_connections_queued_while_the_loop_was_busy_are_taken_together(
    held: tuple[HeldLoop, int],
) -> None:
    """Old code (uvloop's listener): the 64 requests read 64 different pass counts at least 63
    passes apart, one connection accepted per pass. Now all are accepted on one readiness and
    answered within a few passes of each other."""
    app, port = held
    holder = get(port, "/hold")
    assert app.holding.wait(WAIT_S)
    queued = [get(port, "/pass") for _ in range(QUEUED)]  # the kernel completes them meanwhile
    app.release.set()
    assert body(holder) == "released"
    passes = sorted(int(body(conn)) for conn in queued)
    assert passes[-1] - passes[0] < QUEUED // 8, passes
