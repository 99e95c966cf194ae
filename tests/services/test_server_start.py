"""start_server_thread hands back a server whose socket listens, and the socket is closed when
it stops. It waits on uvicorn's `started` flag, which ServiceServer's startup sets after its
socket listens (services/serving/uvicorn_internals.py), so that order is pinned here."""

from __future__ import annotations

import socket
import threading

import uvicorn
from starlette.applications import Starlette

from services.serving.serve import bind, start_server_thread
from services.serving.uvicorn_internals import ServiceServer


def test_the_listening_socket_is_closed_at_shutdown() -> None:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    stop = start_server_thread(Starlette(), sock)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        stop()
    refused = False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        refused = True
    assert refused


class WatchedSocket(socket.socket):
    """A real listening socket that notes whether its server said `started` when listen() came."""

    server: uvicorn.Server
    started_at_listen: bool | None = None

    def listen(self, backlog: int = socket.SOMAXCONN) -> None:
        self.started_at_listen = self.server.started
        super().listen(backlog)


def test_uvicorn_says_started_only_once_its_socket_listens() -> None:
    """start_server_thread returns once `started` is set: a connect from then on must not be
    refused, so uvicorn must set it after listen() (its Server.startup, pinned version). On
    asyncio's loop, which calls the socket's own listen() (uvloop listens in C, unseen here); the
    order is uvicorn's, whichever loop awaits the listening."""
    sock = WatchedSocket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = ServiceServer(
        uvicorn.Config(Starlette(), log_config=None, lifespan="on", loop="asyncio")
    )
    sock.server = server
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        thread.join(0.05)
        while not server.started and thread.is_alive():
            thread.join(0.05)
        assert server.started
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        assert sock.started_at_listen is False
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
