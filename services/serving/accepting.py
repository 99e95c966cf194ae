"""Accept every pending connection on each readiness of a listening socket.

uvloop's listener, which uvicorn uses, takes one connection per pass of the event loop. A pass of
a saturated loop takes a tenth of a second or more, so at 1,024 busy sessions on one core a new
connection waited 6.6 s in the kernel's accept queue at the median (issue 27; docs/services.md):
the queue grows by every arrival while the existing sessions are served. Here the socket is read
directly: on each readiness, accept until the kernel has none left (at most `backlog`), and hand
each socket to the loop's `connect_accepted_socket`, whose coroutine is driven from this pass
on, not in a task that starts a pass later: a saturated pass is what a new session's first call
would pay once more (benchmarks/new_sessions.py, against a task: its p50 1.0-1.6x the existing
sessions' p50, driven 0.8-1.05x). Only public protocols: the coroutine's `send` and the yielded
future's `add_done_callback` (62c9c25 also set a private asyncio attribute, which nothing needs).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from services.base.logs import log_event

logger = logging.getLogger(__name__)

# accept() errors that mean "out of a resource for now": stop accepting for a moment (as asyncio
# does) instead of spinning on a socket that stays readable.
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
RETRY_AFTER_EXHAUSTION_S = 1.0


class Acceptor:
    """Accepts a listening socket's connections on `loop`, every pending one per readiness (at
    most `backlog`), each connected to a protocol from `factory`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        backlog: int,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.factory = factory
        self.backlog = backlog
        self._reading = False
        self._stopped = False

    def start(self) -> None:
        """Accept from the loop's next pass on (the socket listens already)."""
        self.sock.setblocking(False)
        self._watch()

    def stop(self) -> None:
        """Accept no more (the server is stopping); connections already accepted carry on."""
        self._stopped = True
        self._unwatch()

    def _watch(self) -> None:
        if not self._stopped and self.sock.fileno() != -1:
            self.loop.add_reader(self.sock.fileno(), self._accept_pending)
            self._reading = True

    def _unwatch(self) -> None:
        if self._reading and self.sock.fileno() != -1:
            self.loop.remove_reader(self.sock.fileno())
        self._reading = False

    def _accept_pending(self) -> None:
        for _ in range(self.backlog):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # that client left before we took it; the next may be waiting
            except OSError as exc:
                if exc.errno in EXHAUSTED:
                    self._pause(exc)
                return
            self._connect(conn)

    def _connect(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        self._step(self.loop.connect_accepted_socket(self.factory, conn), conn)

    def _step(self, connecting: Coroutine[Any, Any, object], conn: socket.socket) -> None:
        """Run `connect_accepted_socket` from this pass on, not in a task that starts a pass
        later: its first step builds the transport and schedules `connection_made`; then it
        waits for that, and nothing awaits its result. Resumed as a task would be: when the
        future it yielded is done, or on the next pass after a bare yield."""
        try:
            awaited = connecting.send(None)
        except StopIteration:
            return
        except (Exception, asyncio.CancelledError):  # the client left first, or the loop refused it
            conn.close()
            return
        if isinstance(awaited, asyncio.Future):
            awaited.add_done_callback(lambda _: self._step(connecting, conn))
        else:
            self.loop.call_soon(self._step, connecting, conn)

    def _pause(self, exc: OSError) -> None:
        log_event(
            logger,
            "accept_paused",
            logging.WARNING,
            error=errno.errorcode.get(exc.errno or 0, str(exc.errno)),
            seconds=RETRY_AFTER_EXHAUSTION_S,
        )
        self._unwatch()
        self.loop.call_later(RETRY_AFTER_EXHAUSTION_S, self._watch)
