"""Log lines go out in batches (services/logs.py BufferedStreamHandler): many INFO lines in one
write, none later than the interval, a WARNING at once, everything at shutdown."""

from __future__ import annotations

import io
import logging
import time

from services.logs import BufferedStreamHandler


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


def test_info_lines_are_batched_and_flushed_within_the_interval() -> None:
    stream = CountingStream()
    handler = BufferedStreamHandler(stream, interval_s=0.05)
    logger = logger_with(handler, "test.buffered.info")
    for k in range(200):
        logger.info("call %d", k)
    assert stream.writes == 0  # nothing written per line
    deadline = time.monotonic() + 5
    while stream.getvalue().count("\n") < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.getvalue().splitlines() == [f"call {k}" for k in range(200)]
    assert stream.writes <= 3


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
