"""Prometheus metrics for one service instance (its own registry, so tests and apps never collide)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from services.serving.connections import REASONS, ConnectionGuard
from services.serving.heap import GcCollector

disable_created_metrics()  # type: ignore[no-untyped-call]  # the *_created series double the output and nobody reads them

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServiceMetrics:
    """Requests, their latency, upstream calls and errors, cache hits and misses.

    `service` prefixes every name: deepdive_<service>_requests_total, ...
    """

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, service: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        prefix = f"deepdive_{service}"
        self.requests = Counter(
            f"{prefix}_requests",
            "Requests handled, by operation and outcome (ok or an error code).",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{prefix}_request_latency_seconds",
            "Time to answer a request, by operation.",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.upstream_calls = Counter(
            f"{prefix}_upstream_calls",
            "HTTP requests sent to an upstream (each retry counts).",
            ["upstream"],
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            f"{prefix}_upstream_errors",
            "Failed upstream attempts, by upstream and error kind.",
            ["upstream", "kind"],
            registry=self.registry,
        )
        self.upstream_in_flight = Gauge(
            f"{prefix}_upstream_in_flight",
            "Requests to an upstream now in flight (at most its concurrency bound).",
            ["upstream"],
            registry=self.registry,
        )
        self.upstream_waiting = Gauge(
            f"{prefix}_upstream_waiting",
            "Requests waiting for a slot under an upstream's concurrency bound: above 0 for "
            "long while calls are slow, the bound (not the CPU) is what holds the server back.",
            ["upstream"],
            registry=self.registry,
        )
        self._children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._cache_children: dict[tuple[str, bool], Counter] = {}
        self.cache_hits = Counter(
            f"{prefix}_cache_hits", "Cache hits, by cache.", ["cache"], registry=self.registry
        )
        self.cache_misses = Counter(
            f"{prefix}_cache_misses", "Cache misses, by cache.", ["cache"], registry=self.registry
        )
        self.worker_restarts = Counter(
            f"{prefix}_worker_restarts",
            "Times this worker (its port) was started again by its supervisor after it died or "
            "stopped answering /health; each time its sessions' state was lost. 0 in a server "
            "of one process.",
            registry=self.registry,
        )
        self.prefix = prefix
        self.registry.register(GcCollector(prefix))

    def watch_connections(self, guard: ConnectionGuard) -> None:
        """Read the server's connection counts when /metrics is scraped (none per connection)."""
        self.registry.register(_ConnectionCollector(self.prefix, guard))

    def watch_upstream(
        self, upstream: str, in_flight: Callable[[], float], waiting: Callable[[], float]
    ) -> None:
        """Read an upstream's counts when /metrics is scraped (nothing is done per request)."""
        self.upstream_in_flight.labels(upstream).set_function(in_flight)
        self.upstream_waiting.labels(upstream).set_function(waiting)

    def count_cache(self, cache: str, hit: bool) -> None:
        child = self._cache_children.get((cache, hit))
        if child is None:
            counter = self.cache_hits if hit else self.cache_misses
            child = self._cache_children[(cache, hit)] = counter.labels(cache)
        child.inc()

    def observe_request(self, operation: str, outcome: str, seconds: float) -> None:
        # the labelled children, looked up once (prometheus_client's labels() validates and
        # locks on every call; a service observes every request)
        key = (operation, outcome)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                self.requests.labels(operation, outcome),
                self.latency.labels(operation),
            )
        children[0].inc()
        children[1].observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ConnectionCollector(Collector):
    """`<prefix>_connections_open`, `_connections_refused_total{reason}` (server_full,
    client_share, reserved), `_connections_timed_out_total{phase}` (headers, body) and
    `_connections_evicted_total`, from the guard."""

    def __init__(self, prefix: str, guard: ConnectionGuard) -> None:
        self.prefix = prefix
        self.guard = guard

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            f"{self.prefix}_connections_open",
            "Client connections open now.",
            value=self.guard.open_total,
        )
        refused = CounterMetricFamily(
            f"{self.prefix}_connections_refused",
            "Connections closed unread on arrival: server_full (max connections open), "
            "client_share (that client address held its share already) or reserved (only "
            "the part kept for addresses with few connections was left).",
            labels=["reason"],
        )
        for reason in REASONS:
            refused.add_metric([reason], self.guard.refused[reason])
        yield refused
        timed_out = CounterMetricFamily(
            f"{self.prefix}_connections_timed_out",
            "Connections cut off because the client took longer than the header or body "
            "timeout to send its request.",
            labels=["phase"],
        )
        for phase in ("headers", "body"):
            timed_out.add_metric([phase], self.guard.timed_out[phase])
        yield timed_out
        yield CounterMetricFamily(
            f"{self.prefix}_connections_evicted",
            "Connections that had not sent a byte, closed to admit an address within its "
            "share while their own address held more than its share.",
            value=self.guard.evicted,
        )
