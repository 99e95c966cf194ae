"""The header and body timeouts' decisions (services/serving/uvicorn_internals.py) on a loop the
test runs by hand: uvicorn's real protocol (our subclass), fed bytes through a fake transport,
with time that moves only when the test says. When a slow client is cut off is decided here to
the tick; test_serve_limits.py checks the same end to end on a real server, with wide bounds."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Coroutine
from typing import Any

from pytest import approx

from services.serving.connections import ConnectionGuard, ConnectionLimits
from services.serving.uvicorn_internals import lone_protocol
from tests.helpers import FakeClock

SLOW_HEADERS = b"GET /hello HTTP/1.1\r\nHost: test\r\nX-Slow: " + b"a" * 100


class FakeHandle:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTask:
    """What the protocol gets for the app's task: the app never runs here (its coroutine is
    closed at once), so a request's response never completes."""

    def add_done_callback(self, _: Callable[[Any], None]) -> None:
        pass


class FakeLoop:
    """The parts of an event loop the protocol uses: `call_later` on a FakeClock, `create_task`."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._due: list[tuple[float, int, FakeHandle, Callable[[], None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.clock()

    def call_later(self, delay: float, callback: Callable[[], None]) -> FakeHandle:
        handle = FakeHandle()
        heapq.heappush(self._due, (self.clock() + delay, next(self._order), handle, callback))
        return handle

    def create_task(self, coroutine: Coroutine[Any, Any, Any]) -> FakeTask:
        coroutine.close()
        return FakeTask()

    def advance_to(self, instant: float) -> None:
        """Move the time to `instant`, running every timer due by then, in order."""
        while self._due and self._due[0][0] <= instant:
            when, _, handle, callback = heapq.heappop(self._due)
            self.clock.now = max(self.clock.now, when)
            if not handle.cancelled:
                callback()
        self.clock.now = instant


class FakeTransport:
    """A socket's transport that records when the server aborted it (on the fake clock)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.aborted_at: float | None = None
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.aborted_at is not None

    def abort(self) -> None:
        self.aborted_at = self.clock()

    def close(self) -> None:
        raise AssertionError("a slow client is aborted, not closed")

    def write(self, data: bytes) -> None:
        raise AssertionError("nothing is answered here")

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def app(scope: Any, receive: Any, send: Any) -> None:  # never run (FakeTask)
    raise AssertionError("the app does not run on the fake loop")


class Connection:
    """One connection to a protocol on the fake loop, opened at the clock's 0."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.clock = FakeClock(now=0.0)
        self.loop = FakeLoop(self.clock)
        self.guard = ConnectionGuard(limits, clock=self.clock)
        self.protocol = lone_protocol(self.guard, app, self.loop)  # type: ignore[arg-type]
        self.transport = FakeTransport(self.clock)
        self.protocol.connection_made(self.transport)  # type: ignore[arg-type]

    @property
    def cut_at(self) -> float | None:
        return self.transport.aborted_at

    def send_at(self, instant: float, data: bytes) -> None:
        self.loop.advance_to(instant)
        assert self.cut_at is None, f"cut off at {self.cut_at} s"
        self.protocol.data_received(data)

    def trickle(self, data: bytes, start: float, every_s: float, until: float) -> float | None:
        """Send `data` a byte every `every_s` from `start`; the instant the server cut the
        connection (on the fake clock), or None if it was open at `until`."""
        instant = start
        for byte in data:
            if instant > until:
                break
            self.loop.advance_to(instant)
            if self.cut_at is not None:
                return self.cut_at
            self.protocol.data_received(bytes([byte]))
            instant += every_s
        self.loop.advance_to(until)
        return self.cut_at


def test_headers_trickled_are_cut_at_the_header_timeout_from_the_connection_opening() -> None:
    """A byte every 0.3 s never lets the timer start over: the cut is at 1.0 s exactly."""
    connection = Connection(ConnectionLimits(header_timeout=1.0, body_timeout=10.0))
    assert connection.trickle(SLOW_HEADERS, start=0.0, every_s=0.3, until=30.0) == approx(1.0)
    assert connection.guard.timed_out == {"headers": 1}


def test_the_body_timer_starts_when_the_headers_are_complete() -> None:
    """Headers that took 0.8 s of a 1 s header timeout leave the body its whole 1 s: trickled,
    it is cut at 1.8 s, not at 1.0 s."""
    connection = Connection(ConnectionLimits(header_timeout=1.0, body_timeout=1.0))
    head = b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n"
    connection.send_at(0.0, head[:10])
    connection.send_at(0.8, head[10:])
    assert connection.trickle(b"x" * 1000, start=0.8, every_s=0.3, until=30.0) == approx(1.8)
    assert connection.guard.timed_out == {"body": 1}


def test_a_whole_request_starts_no_timer_and_the_apps_time_is_its_own() -> None:
    connection = Connection(ConnectionLimits(header_timeout=1.0, body_timeout=1.0))
    connection.send_at(0.5, b"POST /slow HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n\r\nok")
    connection.loop.advance_to(3600.0)  # the app works for an hour: nobody's timeout
    assert connection.cut_at is None and connection.guard.timed_out == {}


def test_a_body_the_app_has_not_read_yet_is_not_timed_out() -> None:
    """Past 64 KiB unread, uvicorn stops reading: the delay is the server's, so the body timer
    starts over instead of cutting the client off."""
    connection = Connection(ConnectionLimits(header_timeout=1.0, body_timeout=1.0))
    head = b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 200000\r\n\r\n"
    connection.send_at(0.0, head + b"x" * 70_000)
    assert not connection.transport.reading  # uvicorn paused: the app has not taken the body
    connection.loop.advance_to(60.0)
    assert connection.cut_at is None and connection.guard.timed_out == {}
    connection.protocol.flow.resume_reading()  # the app reads; the client must now deliver
    connection.loop.advance_to(61.0)
    assert connection.cut_at is not None and connection.guard.timed_out == {"body": 1}


def test_a_pipelined_request_waiting_for_the_one_before_is_not_timed_out() -> None:
    """The first request's response is still being made (the app never finishes here): the
    second request's headers, arriving slowly behind it, wait on the server, not the client."""
    connection = Connection(ConnectionLimits(header_timeout=1.0, body_timeout=1.0))
    connection.send_at(0.0, b"GET /nap HTTP/1.1\r\nHost: test\r\n\r\nGET /hello HTTP/1.1\r\n")
    connection.loop.advance_to(60.0)
    assert connection.cut_at is None and connection.guard.timed_out == {}
