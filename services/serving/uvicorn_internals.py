"""Every use of uvicorn's internals, in one module, pinned to one uvicorn minor version.

uvicorn documents `uvicorn.Config`, `uvicorn.Server.run` and `uvicorn.run`; what is subclassed
here is not part of that, so it may change in any release. pyproject pins uvicorn to
UVICORN_MINOR (`>=0.54,<0.55`) and tests/services/test_uvicorn_pin.py fails when the installed
minor version is another: whoever moves the pin re-reads, in uvicorn's source,

- `uvicorn.protocols.http.httptools_impl.HttpToolsProtocol`: `connection_made`,
  `connection_lost`, `data_received`, `on_message_begin`, `on_headers_complete`,
  `on_message_complete`, `handle_websocket_upgrade`, and the attributes `transport`, `loop`,
  `client`, `cycle` (`response_complete`) and `flow` (`read_paused`) they use;
- `uvicorn.Server.capture_signals`: a context manager that re-raises a captured SIGTERM/SIGINT
  once it exits; `Server.shutdown`; and `Server.startup`, which runs the lifespan's startup,
  makes no listener when given no sockets (`sockets=[]`) and then sets `started`; the
  attributes `server_state`, `lifespan.state` and `config.http_protocol_class` (with its
  `config`, `server_state`, `app_state`, `_loop` arguments) that its listener's protocol
  factory uses.

tests/test_private_imports.py keeps every other module off uvicorn's and asyncio's internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import ClassVar

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from services.base.logs import flush_logs
from services.serving.accepting import Acceptor
from services.serving.connections import ConnectionGuard, Phase

UVICORN_MINOR = "0.54"


class ServiceServer(uvicorn.Server):
    """`uvicorn.Server` that accepts every pending connection on each readiness of its sockets
    (services/serving/accepting.py: why not uvloop's listener, one per pass of the loop), and
    writes batched log lines (services/base/logs.py, and the counts its connection guard has not
    reported yet) before it ends."""

    def __init__(self, config: uvicorn.Config, guard: ConnectionGuard | None = None) -> None:
        super().__init__(config)
        self.guard = guard
        self.acceptors: list[Acceptor] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets is None:  # uvicorn binds its own (not how our services start)
            await super().startup(sockets=None)
            return
        for sock in sockets:
            # From here on a connect queues in the kernel, not refused, while the lifespan runs:
            # `started` (set by uvicorn's startup) then means "connects succeed".
            sock.listen(self.config.backlog)
        await super().startup(sockets=[])  # the lifespan, then `started`; no listener of its own
        if self.should_exit:
            return
        loop = asyncio.get_running_loop()
        config, state = self.config, self.server_state

        def protocol() -> asyncio.Protocol:
            # as uvicorn's own listener builds each connection's protocol
            made: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=state, app_state=self.lifespan.state, _loop=loop
            )
            return made

        self.acceptors = [Acceptor(loop, sock, protocol, config.backlog) for sock in sockets]
        for acceptor in self.acceptors:
            acceptor.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for acceptor in self.acceptors:
            acceptor.stop()
        await super().shutdown(sockets=sockets)
        if self.guard is not None:
            self.guard.write_reports()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn re-raises a captured SIGTERM/SIGINT on the way out, ending the process by
        the signal, where no exit handler runs: the lines still buffered are written first."""
        with super().capture_signals():
            try:
                yield
            finally:
                flush_logs()


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header timeout, a body timeout, and the connection
    caps (in all and per client address) of its server's `ConnectionGuard`.

    Use `protocol_class(guard)`: each server gets its own subclass carrying its guard.
    """

    guard: ClassVar[ConnectionGuard]

    _admitted = False
    _counted = False  # in the guard's bookkeeping (an evicted connection leaves it at once)
    _silent = False  # admitted and not a byte received yet: evictable
    _peer: str | None = None
    _phase: Phase | None = None
    _timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        self._peer = peer[0] if isinstance(peer, tuple) else None
        if not self.guard.admit(self._peer, self.loop.call_later):
            # Before uvicorn counts it or reads a byte: the client's first recv() sees the close.
            transport.close()
            return
        self._admitted = self._counted = self._silent = True
        super().connection_made(transport)
        self._arm("headers")
        self.guard.hold_silent(self._peer, self, self._evict)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._counted:
            self._counted = False
            self.guard.release(self._peer, self)
        if self._admitted:  # a refused connection never joined anyone's bookkeeping
            self._admitted = False
            super().connection_lost(exc)

    def _evict(self) -> None:
        """The guard gave this silent connection's place to a newcomer (it has released it)."""
        self._counted = self._silent = False
        self._disarm()
        self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self._admitted or not self._counted:
            return
        if self._silent:
            self._silent = False
            self.guard.spoke(self._peer, self)
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
        self.guard.note_timed_out(phase, self._peer, self.loop.call_later)
        self._phase = None
        # abort, not close: a client that also stops reading must not hold the socket open
        # through a write buffer that never drains.
        self.transport.abort()


def protocol_class(guard: ConnectionGuard) -> type[LimitedHttpToolsProtocol]:
    """A protocol class for one uvicorn server (`uvicorn.Config(http=...)`), with its guard."""

    class ServerProtocol(LimitedHttpToolsProtocol):
        pass

    ServerProtocol.guard = guard
    return ServerProtocol


def lone_protocol(
    guard: ConnectionGuard, app: ASGIApp, loop: asyncio.AbstractEventLoop
) -> LimitedHttpToolsProtocol:
    """One connection's protocol outside any server (a state of its own), on `loop`: how
    tests/services/test_connection_timers.py runs the timeouts on a loop whose time it moves."""
    config = uvicorn.Config(app, log_config=None, lifespan="off")
    return protocol_class(guard)(config, ServerState(), {}, loop)
