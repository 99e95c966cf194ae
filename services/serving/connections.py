"""Per-connection limits for our uvicorn servers: slow clients are cut off, open sockets are capped.

Why here and not in an ASGI middleware: the app (and its bearer-token check) only runs once a
request's headers are complete, so a client that trickles its headers one byte at a time holds a
socket forever without ever meeting our code. uvicorn's own `limit_concurrency` answers 503 only
after a request line arrives, and it has no header or body timeout. So the HTTP protocol itself
(uvicorn's httptools protocol, subclassed) arms a timer per phase:

    headers  from the connection opening, or from the first byte of the next request on a
             keep-alive connection, until the request line and headers are complete
    body     from the end of the headers until the whole body has arrived

The app's own processing time (a tool call may take a minute) is in neither phase, nor is time the
server itself stops reading (a pipelined request waiting its turn, or a body the app has not read
yet): then the timer starts over instead of closing. Idle time between requests on a keep-alive
connection stays uvicorn's `timeout_keep_alive` (5 s).
"""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import time
from dataclasses import dataclass
from typing import ClassVar, Literal

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.logs import log_event
from services.typed_config import require

logger = logging.getLogger(__name__)

Phase = Literal["headers", "body"]

# Sockets a server needs besides its clients: upstream connections, corpus and index files, logs.
FD_HEADROOM = 512
# A flood of refused connections is reported at most this often, with a count, not line by line.
REJECTION_REPORT_INTERVAL_S = 5.0


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many connections may be open.

    header_timeout   10 s: the request line and headers must arrive within this many seconds
                     of the connection opening (or of the next request's first byte). A real
                     client sends them in one packet; 10 s still covers a congested link.
    body_timeout     30 s: the whole body must arrive within this many seconds of the headers.
                     The largest body we accept (16 MB at the reward server) then needs about
                     0.5 MB/s; the tool server's 1 MB limit needs 33 KB/s.
    max_connections  4096: connections open at once; the next is closed at once, unread. One
                     rollout process alone may keep 1024 connections to a service (the pool
                     size in deepdive/clients.py), so 1024 would refuse a single busy trainer;
                     4096 leaves room for four while bounding file descriptors (`serve()` raises
                     the soft open-files limit to cover them when the hard limit allows).
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 4096

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout"):
            _check_seconds(name, getattr(self, name))
        _check_count("max_connections", self.max_connections)


def _option(name: str) -> str:
    """The field's name as the command line spells it, so the message fits either origin."""
    return f"{name} (--{name.replace('_', '-')})"


def _check_seconds(name: str, value: object) -> None:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )
    require(ok, _option(name), "a positive number of seconds", value)


def _check_count(name: str, value: object) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int) and value > 0
    require(ok, _option(name), "a positive whole number", value)


class ConnectionGuard:
    """One server's limits and its count of refused connections (shared by its connections)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.rejected_total = 0
        self._unreported = 0
        self._last_report = -math.inf

    def note_rejected(self, open_connections: int) -> None:
        """Count a refused connection; log at most one line per interval, whatever the flood."""
        self.rejected_total += 1
        self._unreported += 1
        now = time.monotonic()
        if now - self._last_report < REJECTION_REPORT_INTERVAL_S:
            return
        log_event(
            logger,
            "connection_rejected",
            logging.WARNING,
            open=open_connections,
            max_connections=self.limits.max_connections,
            rejected=self._unreported,
            rejected_total=self.rejected_total,
        )
        self._unreported = 0
        self._last_report = now


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header timeout, a body timeout and a connection cap.

    Use `protocol_class(limits)`: each server gets its own subclass carrying its guard.
    """

    guard: ClassVar[ConnectionGuard]

    _rejected = False
    _phase: Phase | None = None
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        open_connections = len(self.connections)
        if open_connections >= self.guard.limits.max_connections:
            # Before uvicorn counts it or reads a byte: the client's first recv() sees the close.
            self._rejected = True
            transport.close()
            self.guard.note_rejected(open_connections)
            return
        super().connection_made(transport)
        self._arm("headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if not self._rejected:  # a refused connection never joined uvicorn's bookkeeping
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        idle = self.cycle is None or self.cycle.response_complete
        if self._timer is None and self._phase is None and idle:
            # Bytes between requests: llhttp skips blank lines without starting a message, so
            # on_message_begin alone would let a client trickle "\r\n" forever.
            self._phase = "headers"
        super().data_received(data)
        # A phase's timer is armed only if the phase outlives this chunk: a request that came
        # whole (the usual case) never creates one (two timers per request were ~2 % of a
        # cached call's CPU).
        if self._phase is not None and self._timer is None and not self.transport.is_closing():
            self._arm(self._phase)

    def on_message_begin(self) -> None:
        if self._timer is None and self._phase is None:  # a pipelined request
            self._phase = "headers"
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if self._timer is not None:
            self._arm("body")  # the headers came in pieces: the body's time starts now
        else:
            self._phase = "body"
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()  # from here on the time is the app's
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        self._disarm()  # the transport now belongs to the websocket protocol
        super().handle_websocket_upgrade()

    def _arm(self, phase: Phase) -> None:
        self._disarm()
        self._phase = phase
        self._timer = self.loop.call_later(self._seconds(phase), self._expired)

    def _seconds(self, phase: Phase) -> float:
        limits = self.guard.limits
        return limits.header_timeout if phase == "headers" else limits.body_timeout

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, None

    def _server_is_waiting(self) -> bool:
        """True when the delay is ours: reading is paused (the app has not taken the body yet, or
        a pipelined request waits its turn), or an earlier response on this connection is still
        being produced."""
        if self.flow.read_paused:
            return True
        earlier_response_pending = self.cycle is not None and not self.cycle.response_complete
        return self._phase == "headers" and earlier_response_pending

    def _expired(self) -> None:
        phase = self._phase
        self._timer = None
        if phase is None or self.transport.is_closing():
            return
        if self._server_is_waiting():
            self._arm(phase)
            return
        log_event(
            logger,
            "slow_client_closed",
            phase=phase,
            client=f"{self.client[0]}:{self.client[1]}" if self.client else None,
            timeout_s=self._seconds(phase),
        )
        self._phase = None
        # abort, not close: a client that also stops reading must not hold the socket open
        # through a write buffer that never drains.
        self.transport.abort()


def protocol_class(limits: ConnectionLimits) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for one uvicorn server (`uvicorn.Config(http=...)`), with its own guard."""

    class ServerProtocol(LimitedHttpToolsProtocol):
        guard = ConnectionGuard(limits)

    return ServerProtocol


def ensure_fd_limit(max_connections: int) -> None:
    """Raise the soft open-files limit (up to the hard one) so the connection cap, not EMFILE,
    is what refuses clients: past the limit, accept() fails and every request, upstream calls
    included, suffers. Go servers do the same at start-up; a shortfall is logged, not fatal."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + FD_HEADROOM
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
        else:
            log_event(logger, "open_files_limit_raised", old=soft, new=target)
    if target < need:
        log_event(
            logger,
            "open_files_limit_low",
            logging.WARNING,
            limit=target,
            max_connections=max_connections,
            hint="raise `ulimit -n` or lower --max-connections",
        )
