"""Per-connection limits for our uvicorn servers: slow clients are cut off, open sockets are
capped, in all and per client address. The policy is here; the hooks in uvicorn's protocol that
apply it are in services/serving/uvicorn_internals.py.

Why in the protocol and not in an ASGI middleware: the app (and its bearer-token check) only
runs once a request's headers are complete, so a client that trickles its headers one byte at a
time holds a socket forever without ever meeting our code. uvicorn's own `limit_concurrency`
answers 503 only after a request line arrives, and it has no header or body timeout. So the HTTP
protocol itself arms a timer per phase:

    headers  from the connection opening, or from the first byte of the next request on a
             keep-alive connection, until the request line and headers are complete
    body     from the end of the headers until the whole body has arrived

The app's own processing time (a tool call may take a minute) is in neither phase, nor is time the
server itself stops reading (a pipelined request waiting its turn, or a body the app has not read
yet): then the timer starts over instead of closing. Idle time between requests on a keep-alive
connection stays uvicorn's `timeout_keep_alive` (5 s).

Refused and cut-off connections are counted (/metrics: `<service>_connections_refused_total
{reason}`, `<service>_connections_timed_out_total{phase}`) and logged as one WARNING line per
5 s at most with the counts: a peer holding 4,200 idle sockets had written a line per socket
cut off at the header timeout (16,529 lines in 40 s).
"""

from __future__ import annotations

import logging
import math
import resource
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from services.base.clock import SYSTEM_CLOCK, Now
from services.base.logs import log_event
from services.base.typed_config import require

logger = logging.getLogger(__name__)

Phase = Literal["headers", "body"]

# Sockets a server needs besides its clients: upstream connections, corpus and index files, logs.
FD_HEADROOM = 512
# Refused and cut-off connections are reported at most this often, with counts, not line by line.
REPORT_INTERVAL_S = 5.0


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many connections may be open.

    header_timeout   10 s: the request line and headers must arrive within this many seconds
                     of the connection opening (or of the next request's first byte). A real
                     client sends them in one packet; 10 s still covers a congested link.
    body_timeout     30 s: the whole body must arrive within this many seconds of the headers.
                     The largest body we accept (16 MB at the reward server) then needs about
                     0.5 MB/s; the tool server's 1 MB limit needs 33 KB/s.
    max_connections  4096: connections open at once; the next is closed at once, unread. One
                     rollout process alone may keep 1024 connections to a service (the pool
                     size in deepdive/clients.py), so 1024 would refuse a single busy trainer;
                     4096 leaves room for four while bounding file descriptors (`serve()` raises
                     the soft open-files limit to cover them when the hard limit allows).
    max_connections_per_client
                     connections one client address may hold (default: half of max_connections,
                     2048): a node's rollout (1024 per process) fits, and one peer, however
                     many sockets it opens, leaves the other half to everyone else.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 4096
    max_connections_per_client: int | None = None

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout"):
            _check_seconds(name, getattr(self, name))
        _check_count("max_connections", self.max_connections)
        if self.max_connections_per_client is not None:
            _check_count("max_connections_per_client", self.max_connections_per_client)

    @property
    def client_share(self) -> int:
        """Connections one client address may hold: as given, else half the cap."""
        given = self.max_connections_per_client
        return given if given is not None else max(1, self.max_connections // 2)


def _check_seconds(name: str, value: object) -> None:
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )
    require(ok, name, "a positive number of seconds", value)


def _check_count(name: str, value: object) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int) and value > 0
    require(ok, name, "a positive whole number", value)


Schedule = Callable[[float, Callable[[], None]], object]


class BatchedReport:
    """One log line per interval at most, whatever the flood: events are counted by kind and
    the counts written together. The first event after a quiet interval is written at once (on
    the loop's next pass), later ones with the line that ends their interval, so nothing counted
    goes unwritten. `schedule(delay, callback)` is the event loop's `call_later`."""

    def __init__(
        self,
        event: str,
        interval_s: float = REPORT_INTERVAL_S,
        clock: Now = SYSTEM_CLOCK,
    ) -> None:
        self.event = event
        self.interval_s = interval_s
        self.clock = clock
        self.pending: Counter[str] = Counter()
        self.context: dict[str, object] = {}
        self._last = -math.inf
        self._scheduled = False

    def add(self, kind: str, schedule: Schedule, **context: object) -> None:
        """Count one event of `kind`; `context` (the latest value of each key) goes with the line."""
        self.pending[kind] += 1
        self.context.update(context)
        if not self._scheduled:
            self._scheduled = True
            schedule(max(0.0, self._last + self.interval_s - self.clock()), self.write)

    def write(self) -> None:
        self._scheduled = False
        if not self.pending:
            return
        fields: dict[str, object] = dict(sorted(self.pending.items()))
        fields.update(self.context)
        log_event(logger, self.event, logging.WARNING, **fields)
        self.pending.clear()
        self.context.clear()
        self._last = self.clock()


class ConnectionGuard:
    """One server's connection bookkeeping: which connections may open, and what was refused or
    cut off (counted for /metrics, reported in batches). Shared by the server's connections, on
    its event loop.

    A connection is refused when the server holds `max_connections` (`server_full`), or when its
    client address holds its share already (`client_share`): one peer re-opening thousands of
    idle sockets takes at most its share, and everyone else still gets in."""

    def __init__(self, limits: ConnectionLimits, clock: Now = SYSTEM_CLOCK) -> None:
        self.limits = limits
        self.open_total = 0
        self.open_by_client: dict[str, int] = {}
        self.refused: Counter[str] = Counter()  # reason -> connections refused
        self.timed_out: Counter[str] = Counter()  # phase -> connections cut off
        self._refusals = BatchedReport("connections_refused", clock=clock)
        self._slow = BatchedReport("slow_clients_closed", clock=clock)

    def admit(self, client: str | None, schedule: Schedule) -> bool:
        """Whether a new connection from `client` (its address) may open; counted if so."""
        held = self.open_by_client.get(client, 0) if client is not None else 0
        if self.open_total >= self.limits.max_connections:
            reason = "server_full"
        elif held >= self.limits.client_share:
            reason = "client_share"
        else:
            self.open_total += 1
            if client is not None:
                self.open_by_client[client] = held + 1
            return True
        self.refused[reason] += 1
        self._refusals.add(
            reason,
            schedule,
            open=self.open_total,
            max_connections=self.limits.max_connections,
            max_per_client=self.limits.client_share,
            last_client=client,
        )
        return False

    def release(self, client: str | None) -> None:
        """An admitted connection closed."""
        self.open_total -= 1
        if client is None:
            return
        held = self.open_by_client.get(client, 0) - 1
        if held > 0:
            self.open_by_client[client] = held
        else:
            self.open_by_client.pop(client, None)

    def write_reports(self) -> None:
        """Write what is counted but not reported yet (the server is stopping)."""
        self._refusals.write()
        self._slow.write()

    def note_timed_out(self, phase: Phase, client: str | None, schedule: Schedule) -> None:
        """A client too slow with its headers or body was cut off: one of a batch, not a line
        each (a peer holding thousands of silent sockets would write thousands of lines)."""
        self.timed_out[phase] += 1
        limits = self.limits
        self._slow.add(
            phase,
            schedule,
            header_timeout_s=limits.header_timeout,
            body_timeout_s=limits.body_timeout,
            last_client=client,
        )


def ensure_fd_limit(max_connections: int) -> None:
    """Raise the soft open-files limit (up to the hard one) so the connection cap, not EMFILE,
    is what refuses clients: past the limit, accept() fails and every request, upstream calls
    included, suffers. Go servers do the same at start-up; a shortfall is logged, not fatal."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + FD_HEADROOM
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
        else:
            log_event(logger, "open_files_limit_raised", old=soft, new=target)
    if target < need:
        log_event(
            logger,
            "open_files_limit_low",
            logging.WARNING,
            limit=target,
            max_connections=max_connections,
            hint="raise `ulimit -n` or lower connections.max_connections",
        )
