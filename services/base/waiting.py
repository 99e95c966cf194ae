"""Waiting for something another process does, without fixed sleeps: poll with a backoff that
starts at 10 ms (a fast event is seen at once) and grows to 250 ms (a slow one costs little),
check on every round whether waiting still makes sense, and stop at a deadline."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from services.base.clock import SYSTEM_CLOCK, Clock
from services.base.errors import RuntimeFailure

T = TypeVar("T")

BACKOFF_FACTOR = 1.5  # each round waits this much longer than the one before, up to the cap


class WaitTimeout(RuntimeFailure):
    """The awaited thing did not happen before the deadline."""

    code = "wait_timeout"


def wait_for(
    probe: Callable[[], T | None],
    *,
    timeout_s: float,
    what: str,
    check: Callable[[], None] | None = None,
    first_delay_s: float = 0.01,
    max_delay_s: float = 0.25,
    clock: Clock = SYSTEM_CLOCK,
) -> T:
    """The first value of `probe()` that is neither None nor False. `check()` runs between
    rounds and raises to give up early (a child that died, another node that failed). No sleep
    goes past the deadline: the last one is what is left of it."""
    deadline = clock() + timeout_s
    delay = first_delay_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if check is not None:
            check()
        remaining = deadline - clock()
        if remaining <= 0:
            raise WaitTimeout(f"{what}: still waiting after {timeout_s:g} s")
        clock.sleep(min(delay, remaining))
        delay = min(max_delay_s, delay * BACKOFF_FACTOR)
