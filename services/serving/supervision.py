"""When a supervisor restarts a worker, and when it gives up: pure decisions on an injected
clock (services/serving/workers.py does the processes, sockets and pings).

- A worker that died is started again after a backoff (0.5 s, doubled for each restart in the
  last minute, at most 10 s); past `max_restarts` restarts in any minute, over all workers,
  the server fails as it did before restarts existed (something is wrong with every worker,
  not one page).
- A worker is pinged (GET /health) every `ping_interval_s`, each ping given `ping_timeout_s`;
  once it is up (it said it serves, or answered a ping), `missed_pings` misses in a row mean it
  is frozen (a worker whose event loop is stuck never notices by itself), and it is killed and
  restarted. A worker still loading its app is frozen only once `start_timeout_s` have passed.

A worker that stops answering right after an answer is found `missed_pings` x
(`ping_interval_s` + `ping_timeout_s`) later (`SupervisionPolicy.found_within_s`): 8 s by
default, so a frozen worker's sessions are told (their retries reach its replacement, which
answers a click `session_lost`) long before their client gives up. The trade-off: a worker
that cannot answer /health within 3 s twice in a row is killed. A saturated loop answers
within a second (its passes take 0.1-0.3 s); a loop stuck for 3 s is stuck for its sessions
too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from services.base.clock import Now
from services.base.typed_config import positive, require


@dataclass(frozen=True)
class SupervisionPolicy:
    max_restarts: int = 5  # in any `window_s`, over all workers; one more fails the server
    window_s: float = 60.0
    first_backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    ping_interval_s: float = 1.0
    ping_timeout_s: float = 3.0
    missed_pings: int = 2
    start_timeout_s: float = 300.0  # a worker not up by then is frozen (its app is built
    # after the fork from what the supervisor loaded: seconds, not minutes)

    def __post_init__(self) -> None:
        for name in ("max_restarts", "missed_pings"):
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool)
            least = 0 if name == "max_restarts" else 1
            require(ok and value >= least, name, f"a whole number >= {least}", value)
        for name in (
            "window_s",
            "first_backoff_s",
            "max_backoff_s",
            "ping_interval_s",
            "ping_timeout_s",
            "start_timeout_s",
        ):
            positive(name, getattr(self, name))

    @property
    def found_within_s(self) -> float:
        """The longest a worker that is up can go unanswered before it counts as frozen: each
        missed ping waits `ping_interval_s` after the last outcome, then `ping_timeout_s`."""
        return self.missed_pings * (self.ping_interval_s + self.ping_timeout_s)


class RestartBudget:
    """Restarts over all of a supervisor's workers in the last `window_s`."""

    def __init__(self, policy: SupervisionPolicy, clock: Now) -> None:
        self.policy = policy
        self.clock = clock
        self._times: deque[float] = deque()

    def recent(self) -> int:
        horizon = self.clock() - self.policy.window_s
        while self._times and self._times[0] <= horizon:
            self._times.popleft()
        return len(self._times)

    def allows_another(self) -> bool:
        return self.recent() < self.policy.max_restarts

    def backoff_s(self) -> float:
        """The wait before the next restart: doubled for each restart in the window."""
        policy = self.policy
        return float(min(policy.max_backoff_s, policy.first_backoff_s * 2 ** self.recent()))

    def record(self) -> None:
        self._times.append(self.clock())


class Liveness:
    """One worker's pings: when the next is due, and whether it counts as frozen."""

    def __init__(self, policy: SupervisionPolicy, clock: Now) -> None:
        self.policy = policy
        self.clock = clock
        self.started_at = clock()
        self.up = False
        self.misses = 0
        self.next_ping = self.started_at + policy.ping_interval_s

    def due(self) -> bool:
        return self.clock() >= self.next_ping

    def ping_sent(self) -> float:
        """A ping goes out now: the instant by which its answer must have come."""
        return self.clock() + self.policy.ping_timeout_s

    def serving(self) -> None:
        """The worker said its app is built and it serves: from now on a miss counts."""
        self.up = True

    def pinged(self, answered: bool) -> None:
        """A ping's outcome: answered with 200, or not (no reply in time, refused, an error)."""
        if answered:
            self.up, self.misses = True, 0
        elif self.up:
            self.misses += 1
        self.next_ping = self.clock() + self.policy.ping_interval_s

    def frozen(self) -> str | None:
        """Why the worker counts as frozen, or None while it does not."""
        policy = self.policy
        if self.up and self.misses >= policy.missed_pings:
            return (
                f"did not answer /health {self.misses} times in a row "
                f"({policy.ping_timeout_s:g} s each)"
            )
        waited = self.clock() - self.started_at
        if not self.up and waited >= policy.start_timeout_s:
            return f"never said it serves nor answered /health in {waited:.0f} s since it started"
        return None
