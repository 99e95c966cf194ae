"""The garbage collector of a service process: what startup made is frozen, and young
objects are collected in larger batches, so a busy server is not stopped for 0.1-0.2 s at a time.

Measured on the tool server under the benchmark's loads (mixed at 64 sessions, then 1,024
sessions with 0.5 s think time; ~38 s of load), gc.callbacks timing every collection: with
CPython's defaults (700, 10, 10) about 1,450 collections took ~4.9 s, the full ones 100-225 ms
each (a pause every session waits through: most of the new sessions' tail past 100 ms). Those
full collections walk what the run itself made (cached results, sessions, in-flight requests),
so freezing the startup heap alone changed nothing (~5.0 s); collecting young objects every
20,000 allocations instead of 700, and the older generations less often, took it to ~0.5 s
(170 collections, the longest ~40 ms), with new sessions answered within 100 ms 97 % of the
time instead of 78-84 %. It costs no memory because those paths make no cyclic garbage
(gc.DEBUG_SAVEALL found none): the resident memory stayed within 8 % of the defaults' in the
same runs, and the side-by-side benchmark reports it with every accept run. Where a cycle did
hold data (services/client/plain_http.py, a connection the server closed) it was fixed at its source.
"""

from __future__ import annotations

import gc
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

# gen0 every 20,000 net allocations; gen1 every 50 of those, gen2 every 100 of gen1 (and, as
# CPython always does, only once the objects waiting for it are a quarter of those it holds)
SERVICE_GC_THRESHOLDS = (20_000, 50, 100)
# Measured on CPython 3.11's three-generation collector. 3.10 to 3.13 have the same one (the
# thresholds count allocations and collections alike; slime's image runs 3.12). From 3.14 the
# collector is incremental, with two generations and thresholds that mean something else: the
# figures above say nothing there, so CPython's own thresholds stay.
TUNED_VERSIONS = ((3, 10), (3, 13))


@dataclass
class _Pauses:
    count: list[int] = field(default_factory=lambda: [0, 0, 0])
    seconds: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    started: float = 0.0


_pauses = _Pauses()


def service_gc_thresholds(
    version: tuple[int, int] = (sys.version_info.major, sys.version_info.minor),
    implementation: str = platform.python_implementation(),
) -> tuple[int, int, int] | None:
    """The thresholds a service sets on this interpreter: SERVICE_GC_THRESHOLDS on the CPython
    versions whose collector they were measured for, None (leave CPython's own) elsewhere."""
    first, last = TUNED_VERSIONS
    if implementation == "CPython" and first <= version <= last:
        return SERVICE_GC_THRESHOLDS
    return None


def settle_heap() -> None:
    """Called once a service process has built its app, before it serves: collect startup's
    garbage, freeze the rest (it lives as long as the process; a fork then shares its pages),
    raise the collection thresholds (where they were measured: service_gc_thresholds) and time
    every collection for /metrics."""
    gc.collect()
    gc.freeze()
    thresholds = service_gc_thresholds()
    if thresholds is not None:
        gc.set_threshold(*thresholds)
    if _time_collection not in gc.callbacks:
        gc.callbacks.append(_time_collection)


def _time_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _pauses.started = time.perf_counter()
        return
    generation: int = info["generation"]
    _pauses.count[generation] += 1
    _pauses.seconds[generation] += time.perf_counter() - _pauses.started


class GcCollector(Collector):
    """`<prefix>_gc_pause_seconds{generation}` (count and sum of the collections timed since
    settle_heap) and `<prefix>_gc_frozen_objects`: 0 in a process that never settled its heap."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def collect(self) -> Iterator[SummaryMetricFamily | GaugeMetricFamily]:
        pauses = SummaryMetricFamily(
            f"{self.prefix}_gc_pause_seconds",
            "Time the garbage collector stopped the process, by generation: a large mean means "
            "pauses every request waits through.",
            labels=["generation"],
        )
        for generation in range(3):
            pauses.add_metric(
                [str(generation)],
                count_value=_pauses.count[generation],
                sum_value=_pauses.seconds[generation],
            )
        yield pauses
        yield GaugeMetricFamily(
            f"{self.prefix}_gc_frozen_objects",
            "Objects frozen at startup (never scanned by the collector).",
            value=gc.get_freeze_count(),
        )
