"""Accept every pending connection on each readiness of a listening socket.

uvloop's listener, which uvicorn uses, takes one connection per pass of the event loop. A pass of
a saturated loop takes a tenth of a second or more, so at 1,024 busy sessions on one core a new
connection waited 6.6 s in the kernel's accept queue at the median (issue 27; docs/services.md):
the queue grows by every arrival while the existing sessions are served. Here the socket is read
directly: on each readiness, accept until the kernel has none left (at most `backlog`), and hand
each socket to the loop's `connect_accepted_socket` in a task (one pass later; 62c9c25 drove
that coroutine by hand through a private asyncio attribute, for no measurable gain).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable

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
        self._connecting: set[asyncio.Task[object]] = set()  # the loop keeps weak references
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
        try:
            task = self.loop.create_task(self.loop.connect_accepted_socket(self.factory, conn))
        except RuntimeError:  # the loop is closing
            conn.close()
            return
        self._connecting.add(task)
        task.add_done_callback(lambda done: self._connected(done, conn))

    def _connected(self, task: asyncio.Task[object], conn: socket.socket) -> None:
        self._connecting.discard(task)
        if task.cancelled() or task.exception() is not None:
            conn.close()  # the client left first, or the loop refused the socket

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
