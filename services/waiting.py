"""Waiting for something another process does, without fixed sleeps: poll with a backoff that
starts at 10 ms (a fast event is seen at once) and grows to 250 ms (a slow one costs little),
check on every round whether waiting still makes sense, and stop at a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from services.exceptions import ServiceError

T = TypeVar("T")


class WaitTimeout(ServiceError):
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
) -> T:
    """The first value of `probe()` that is neither None nor False. `check()` runs between
    rounds and raises to give up early (a child that died, another node that failed)."""
    deadline = time.monotonic() + timeout_s
    delay = first_delay_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if check is not None:
            check()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WaitTimeout(f"{what}: still waiting after {timeout_s:g} s")
        time.sleep(min(delay, remaining))
        delay = min(max_delay_s, delay * 1.5)
