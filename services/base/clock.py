"""The clock every wait, backoff, deadline and time-to-live reads: the system's by default, one a
test moves by hand otherwise (tests/helpers.py FakeClock), so a test checks the decision (how
long to back off, whether a deadline has passed, when an entry expires) without sleeping through
it on a shared machine.

A `Clock` is called for the time (monotonic seconds, as `time.monotonic()`) and sleeps, in a
thread (`sleep`) or in a task (`await async_sleep`). Code that only reads the time asks for a
`Now`: any Clock is one, and so is `time.monotonic` itself.

Wall-clock dates (the `t` field of a note, an HTTP date) are not this clock's: they stay
`time.time()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

Now = Callable[[], float]


class Clock(Protocol):
    def __call__(self) -> float:
        """Monotonic seconds."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for `seconds`."""
        ...

    async def async_sleep(self, seconds: float) -> None:
        """Suspend the calling task for `seconds`."""
        ...


class SystemClock:
    """The real one: time.monotonic, time.sleep and asyncio.sleep (called directly, no wrapper
    frame: a cache's timer is read on every lookup)."""

    __call__ = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)

    async def async_sleep(self, seconds: float) -> None:
        import asyncio  # not at import: the launcher's modules wait with threads only

        await asyncio.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
