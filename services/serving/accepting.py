"""uvicorn's server with an accept loop that takes every pending connection at once.

Measured on the tool server at 1,024 sessions (benchmarks/side_by_side.py): under uvloop each
pass of the event loop accepted ONE connection (strace: one accept4 per epoll_wait), and a
saturated pass takes ~150 ms, so new sessions queued in the kernel's accept queue for up to
10 s (the queue grew by every arrival: ~900 waiting after 8 s) while existing ones were
served. asyncio's own loop accepts up to the backlog per readiness, but costs ~10 % more CPU
per call. So the listening socket is read here: on each readiness, accept until the kernel has
none left (at most the backlog), and hand each socket to the loop's `connect_accepted_socket`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

import uvicorn

from services.logs import flush_logs, log_event

logger = logging.getLogger(__name__)

# accept() errors that mean "out of a resource for now": stop accepting for a moment (as
# asyncio does), instead of spinning on a socket that stays readable.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
RETRY_AFTER_EXHAUSTION_S = 1.0


class EagerAcceptServer(uvicorn.Server):
    """`uvicorn.Server` serving already bound sockets, accepting every pending connection."""

    _listening: list[socket.socket]

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        # Set once every socket listens. uvicorn's `started` is set inside its own startup,
        # before these sockets listen: a thread that waited on it could connect and be refused
        # (seen once in the container CI on a loaded machine).
        self.accepting = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn starts the lifespan and marks itself started; the sockets are ours.
        await super().startup(sockets=[])
        if self.should_exit:
            return
        loop = asyncio.get_running_loop()
        config = self.config
        factory: functools.partial[asyncio.Protocol] = functools.partial(
            config.http_protocol_class,  # type: ignore[call-arg]  # uvicorn's protocols take these
            config=config,
            server_state=self.server_state,
            app_state=self.lifespan.state,
        )
        self._listening = list(sockets or [])
        for sock in self._listening:
            sock.listen(config.backlog)
            sock.setblocking(False)
            loop.add_reader(sock.fileno(), self._accept_pending, loop, sock, factory)
        self.accepting.set()

    def _accept_pending(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: functools.partial[asyncio.Protocol],
    ) -> None:
        for _ in range(self.config.backlog):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _EXHAUSTED:
                    log_event(
                        logger,
                        "accept_paused",
                        logging.WARNING,
                        error=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                        seconds=RETRY_AFTER_EXHAUSTION_S,
                    )
                    loop.remove_reader(sock.fileno())
                    loop.call_later(
                        RETRY_AFTER_EXHAUSTION_S,
                        loop.add_reader,
                        sock.fileno(),
                        self._accept_pending,
                        loop,
                        sock,
                        factory,
                    )
                return  # ECONNABORTED and the like: that client is gone; the next readiness
            conn.setblocking(False)
            _connect_now(loop.connect_accepted_socket(factory, conn), conn)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn re-raises a captured SIGTERM/SIGINT on the way out, ending the process by
        the signal: batched log lines (services/logs.py) are written before that."""
        with super().capture_signals():
            try:
                yield
            finally:
                flush_logs()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        for sock in getattr(self, "_listening", []):
            if sock.fileno() != -1:
                loop.remove_reader(sock.fileno())
        await super().shutdown(sockets=sockets)


def _connect_now(connecting: Coroutine[Any, Any, object], conn: socket.socket) -> None:
    """Run `connect_accepted_socket` from this pass on, not as a task that starts a pass later.

    Its first step builds the transport and schedules `connection_made`; as a task it would
    start one loop pass later, and a saturated pass is the ~0.3 s every new session paid once
    more than an existing call. This drives the coroutine as a task would (Python 3.12's eager
    tasks start the same way; this runs on 3.11): resumed when the future it awaits is done,
    or after one pass for a bare yield. Nothing awaits its result; a failure closes the socket
    (its own cleanup closed the transport first).
    """
    try:
        awaited = connecting.send(None)
    except StopIteration:
        return
    except (Exception, asyncio.CancelledError):  # the client left first, or the loop refused it
        conn.close()
        return
    resume = functools.partial(_connect_now, connecting, conn)
    if isinstance(awaited, asyncio.Future):
        awaited._asyncio_future_blocking = False  # taken, as asyncio.Task marks it
        awaited.add_done_callback(lambda _: resume())
    else:  # a bare yield (asyncio.sleep(0)): one pass
        asyncio.get_running_loop().call_soon(resume)
