"""When an upstream call is tried again, and for how long: the policy, the attempt loop, the
deadline's arithmetic and `Retry-After`, apart from how a request is carried
(services/client/http.py).

The rules (the lessons of earlier search agents): full-jitter exponential backoff; honour
`Retry-After`, up to a bound; never sleep past the caller's deadline. Which outcomes are worth
another attempt is the transport's call: it hands back a `Retry`.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from services.base.clock import Clock
from services.base.errors import UpstreamError

__all__ = ["GiveUp", "Retry", "RetryPolicy", "parse_retry_after", "read_budget", "with_retries"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry an upstream.

    max_attempts counts the first try. Backoff before retry k (1-based) is uniform in
    [0, min(max_delay_s, base_delay_s * 2**(k-1))]; a Retry-After header raises it to at least
    the advertised wait, and a wait over max_retry_after_s is not attempted at all.
    """

    max_attempts: int = 4
    base_delay_s: float = 0.25
    max_delay_s: float = 8.0
    max_retry_after_s: float = 30.0

    def backoff_cap(self, retry_number: int) -> float:
        """The longest backoff before retry `retry_number` (1-based)."""
        return min(self.max_delay_s, self.base_delay_s * 2.0 ** (retry_number - 1))

    def backoff(self, retry_number: int, draw: Callable[[], float] = random.random) -> float:
        """Full jitter: `draw()` (uniform in [0, 1)) of the cap."""
        return draw() * self.backoff_cap(retry_number)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date); None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Retry(NamedTuple):
    """An attempt's outcome worth another attempt: the error to raise once none is left, and
    the wait its reply advertised (Retry-After), if any."""

    error: UpstreamError
    retry_after: float | None = None


# Builds the error raised when the attempts stop: from the last attempt's error and the words
# that say why (" after 4 attempts", "; no time left to retry within the deadline").
GiveUp = Callable[[UpstreamError, str], UpstreamError]


async def with_retries(
    attempt: Callable[[int], Awaitable[_T | Retry]],
    policy: RetryPolicy,
    clock: Clock,
    deadline: float | None,
    give_up: GiveUp,
    first: Retry | None = None,
) -> _T:
    """`attempt(n)` (1-based) until it returns other than a `Retry`, backing off between tries;
    the error `give_up` builds once the attempts are spent or the next wait is not allowed.
    `first` is attempt 1's outcome where the caller made it already (a call that needs no
    retry then never enters this loop: one coroutine less on every call)."""
    number = 1
    outcome = first if first is not None else await attempt(1)
    while isinstance(outcome, Retry):
        if number >= policy.max_attempts:
            raise give_up(outcome.error, f" after {number} attempts")
        await _back_off(policy, number, outcome, clock, deadline, give_up)
        number += 1
        outcome = await attempt(number)
    return outcome


async def _back_off(
    policy: RetryPolicy,
    number: int,
    outcome: Retry,
    clock: Clock,
    deadline: float | None,
    give_up: GiveUp,
) -> None:
    """Sleep before retry `number`, or raise where the wait is too long or would pass the
    deadline."""
    delay = policy.backoff(number)
    retry_after = outcome.retry_after
    if retry_after is not None:
        if retry_after > policy.max_retry_after_s:
            raise give_up(outcome.error, f"; Retry-After {retry_after:.0f}s is too long")
        delay = max(delay, retry_after)
    if deadline is not None and clock() + delay >= deadline:
        raise give_up(outcome.error, "; no time left to retry within the deadline")
    await clock.async_sleep(delay)


def read_budget(read_timeout_s: float, deadline: float | None, clock: Clock) -> float:
    """Seconds one attempt may take: the read timeout, or less where the deadline is nearer."""
    if deadline is None:
        return read_timeout_s
    return max(0.001, min(read_timeout_s, deadline - clock()))
