"""How often a node looks at things that cost more than a glance: the shared file system (the
other nodes' notes) and Ray's worker logs.

While the job starts, a node waits on notes from the others and every fraction of a second
counts, so it reads them at once (each wait backs off to 0.25 s). In the long phases (serving,
training: hours) the only news on the shared file system is the end of the job or another
node's failure, and a read every few seconds is plenty (NeMo-RL's ray.sub polls once a minute);
its own children it still watches on every round, which costs no file system access.
"""

from __future__ import annotations

from services.base.clock import SYSTEM_CLOCK, Now

START_POLL_S = 0.0  # while starting: whenever a wait's backoff says
LONG_POLL_S = 5.0  # serving and training


class Cadence:
    """`due()` says whether it is time to look again (and starts the next interval)."""

    def __init__(self, interval_s: float = START_POLL_S, clock: Now = SYSTEM_CLOCK) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: float | None = None

    def due(self) -> bool:
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True

    def slow_down(self, interval_s: float = LONG_POLL_S) -> None:
        self.interval_s = interval_s
