"""Per-connection limits for our uvicorn servers: slow clients are cut off, open sockets are
capped, in all and per client address (an even split between the addresses holding any, with a
reserve for newcomers: `refusal()`). The policy is here; the hooks in uvicorn's protocol that
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
                     the most one client address may hold however few others there are
                     (default: half of max_connections, 2048): a node's rollout (1024 per
                     process) fits. Below it, an address's share is the fair one (`share`).
    min_connections_per_client
                     8: what any address may hold however many others there are (a client
                     with a call and a /health in flight needs 2).
    reserved_connections
                     the part of max_connections only addresses holding fewer than
                     min_connections_per_client may take (default: an eighth, 512): two
                     addresses re-opening 2,100 idle sockets each had filled the whole cap and
                     a third address's searches failed 98 %; a newcomer now always finds room.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_connections: int = 4096
    max_connections_per_client: int | None = None
    min_connections_per_client: int = 8
    reserved_connections: int | None = None

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout"):
            _check_seconds(name, getattr(self, name))
        _check_count("max_connections", self.max_connections)
        if self.max_connections_per_client is not None:
            _check_count("max_connections_per_client", self.max_connections_per_client)
        _check_count("min_connections_per_client", self.min_connections_per_client)
        reserved = self.reserved_connections
        if reserved is not None:
            ok = not isinstance(reserved, bool) and isinstance(reserved, int)
            ok = ok and 0 <= reserved < self.max_connections
            require(ok, "reserved_connections", "a whole number below max_connections", reserved)

    @property
    def client_share(self) -> int:
        """The most one client address may hold: as given, else half the cap."""
        given = self.max_connections_per_client
        return given if given is not None else max(1, self.max_connections // 2)

    @property
    def reserve(self) -> int:
        """Connections kept for addresses with few: as given, else an eighth of the cap."""
        given = self.reserved_connections
        return given if given is not None else self.max_connections // 8

    def share(self, addresses: int) -> int:
        """What one of `addresses` client addresses may hold: the unreserved connections split
        evenly, at least the floor, at most `client_share`. With one flooding address per
        rollout worker, a fixed share times the workers exceeds any cap; an even split does not."""
        even = (self.max_connections - self.reserve) // max(1, addresses)
        return min(self.client_share, max(self.min_connections_per_client, even))


Reason = Literal["server_full", "client_share", "reserved"]
REASONS: tuple[Reason, ...] = ("server_full", "client_share", "reserved")


def refusal(held: int, open_total: int, addresses: int, limits: ConnectionLimits) -> Reason | None:
    """Why a new connection from an address holding `held` is refused, or None to admit it.
    `open_total` is what the server holds now, `addresses` the client addresses holding any,
    the asking one included.

    server_full   the cap is reached;
    client_share  the address holds its share (`limits.share(addresses)`) already;
    reserved      only the reserve is left, and the address holds the floor already: the
                  reserve is for newcomers, not for addresses whose share just shrank.
    """
    if open_total >= limits.max_connections:
        return "server_full"
    if held >= limits.share(addresses):
        return "client_share"
    unreserved = limits.max_connections - limits.reserve
    if open_total >= unreserved and held >= limits.min_connections_per_client:
        return "reserved"
    return None


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

    A connection is refused as `refusal()` says: the cap is reached, its client address holds
    its share (which shrinks as more addresses connect), or only the reserve kept for addresses
    with few connections is left: peers re-opening thousands of idle sockets each take at most
    an even split between them, and a newcomer still gets in.

    When the server is full (or only the reserve is left) and the asking address is within its
    share, an address holding more than its share gives up its oldest connection that has not
    sent a byte (`evicted`): many addresses arriving at once exhaust any reserve, and without
    this the newcomer waited for the header timeout to trim the others (10 s of refusals)."""

    def __init__(self, limits: ConnectionLimits, clock: Now = SYSTEM_CLOCK) -> None:
        self.limits = limits
        self.open_total = 0
        self.open_by_client: dict[str, int] = {}
        # client -> its connections that have not sent a byte yet, oldest first, and how to close
        self.silent: dict[str, dict[object, Callable[[], None]]] = {}
        self.refused: Counter[str] = Counter()  # reason -> connections refused
        self.timed_out: Counter[str] = Counter()  # phase -> connections cut off
        self.evicted = 0  # silent connections closed for a client within its share
        self._refusals = BatchedReport("connections_refused", clock=clock)
        self._slow = BatchedReport("slow_clients_closed", clock=clock)
        self._evictions = BatchedReport("silent_connections_evicted", clock=clock)

    def admit(self, client: str | None, schedule: Schedule) -> bool:
        """Whether a new connection from `client` (its address) may open; counted if so."""
        held = self.open_by_client.get(client, 0) if client is not None else 0
        addresses = len(self.open_by_client) + (0 if held else 1)
        reason = refusal(held, self.open_total, addresses, self.limits)
        if (
            reason is not None
            and refusal(held, self.open_total - 1, addresses, self.limits) is None  # room for one
            and self._evict_for(client, addresses, schedule)
        ):
            reason = None
        if reason is None:
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
            addresses=addresses,
            share=self.limits.share(addresses),
            last_client=client,
        )
        return False

    def _evict_for(self, client: str | None, addresses: int, schedule: Schedule) -> bool:
        """Close the oldest silent connection of the address most over its share, if any."""
        share = self.limits.share(addresses)
        over = [
            (held, address)
            for address, held in self.open_by_client.items()
            if held > share and address != client and self.silent.get(address)
        ]
        if not over:
            return False
        _, victim = max(over)
        connections = self.silent[victim]
        key = next(iter(connections))
        close = connections.pop(key)
        self.release(victim, key)
        close()  # the connection forgets the guard: its connection_lost releases nothing more
        self.evicted += 1
        self._evictions.add("over_share", schedule, share=share, last_client=victim)
        return True

    def hold_silent(self, client: str | None, key: object, close: Callable[[], None]) -> None:
        """An admitted connection has sent nothing yet: `close()` may end it for a newcomer."""
        if client is not None:
            self.silent.setdefault(client, {})[key] = close

    def spoke(self, client: str | None, key: object) -> None:
        """The connection `key` sent its first bytes: it is a client's, no longer evictable."""
        if client is None:
            return
        connections = self.silent.get(client)
        if connections is not None:
            connections.pop(key, None)
            if not connections:
                del self.silent[client]

    def release(self, client: str | None, key: object = None) -> None:
        """An admitted connection closed (or was evicted)."""
        self.open_total -= 1
        if client is None:
            return
        self.spoke(client, key)
        held = self.open_by_client.get(client, 0) - 1
        if held > 0:
            self.open_by_client[client] = held
        else:
            self.open_by_client.pop(client, None)

    def write_reports(self) -> None:
        """Write what is counted but not reported yet (the server is stopping)."""
        self._refusals.write()
        self._slow.write()
        self._evictions.write()

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
