"""Log lines go out in batches (services/base/logs.py BufferedStreamHandler): many INFO lines in one
write, none later than the interval, a WARNING at once, everything at shutdown."""

from __future__ import annotations

import io
import logging
import threading

from services.base.logs import BufferedStreamHandler
from services.base.waiting import wait_for
from tests.helpers import FakeClock


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def logger_with(handler: logging.Handler, name: str) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


class GatedClock(FakeClock):
    """The flusher's sleep ends only when the test lets one interval pass (`tick`)."""

    def __init__(self) -> None:
        super().__init__()
        self._ticks = threading.Semaphore(0)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        assert self._ticks.acquire(timeout=60), "the test never let the interval pass"
        self.now += seconds

    def tick(self) -> None:
        self._ticks.release()


def test_info_lines_are_batched_and_flushed_once_the_interval_has_passed() -> None:
    """Many INFO lines, one write, made when the interval has passed: on a clock the test owns,
    so neither a loaded machine's slow logging loop nor a late thread changes the count."""
    stream = CountingStream()
    clock = GatedClock()
    handler = BufferedStreamHandler(stream, interval_s=0.05, clock=clock)
    logger = logger_with(handler, "test.buffered.info")
    try:
        for k in range(200):
            logger.info("call %d", k)
        assert stream.writes == 0  # nothing written per line, nor before the interval
        clock.tick()
        wait_for(lambda: stream.getvalue().endswith("call 199\n"), timeout_s=30, what="the write")
        assert stream.getvalue().splitlines() == [f"call {k}" for k in range(200)]
        assert stream.writes == 1 and clock.sleeps[0] == 0.05
    finally:
        handler.close()
        clock.tick()  # the flusher wakes up, sees the handler closed and ends


def test_a_warning_and_a_full_buffer_are_written_at_once_and_close_flushes() -> None:
    stream = CountingStream()
    handler = BufferedStreamHandler(stream, interval_s=60, capacity=10)
    logger = logger_with(handler, "test.buffered.warning")
    logger.info("before")
    logger.warning("now")
    assert stream.getvalue().splitlines() == ["before", "now"]
    for k in range(10):
        logger.info("line %d", k)
    assert stream.getvalue().count("\n") == 12
    logger.info("last")
    handler.close()
    assert stream.getvalue().splitlines()[-1] == "last"
