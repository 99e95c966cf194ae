"""An async cache with a size bound and a TTL, that collapses concurrent identical calls.

Why collapse: a GRPO group is 8-16 samples of one prompt, and they issue the same first searches
within milliseconds of each other. Without single-flight, each would miss the cache and pay the
upstream. Failures are cached too, briefly, so a broken page is not hammered by a whole group.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from cachetools import TLRUCache

from services.exceptions import DeadlineExceeded, ToolError
from services.metrics import ServiceMetrics

V = TypeVar("V")
CacheOutcome = Literal["hit", "miss", "shared"]


@dataclass(frozen=True)
class CacheSettings:
    """Entries kept at most (LRU beyond), how long a value lives, how long a failure lives.

    `enabled=False` turns caching and call collapsing off (every call goes upstream), for
    debugging a provider and for measuring what the cache saves.
    """

    max_entries: int = 10_000
    ttl_s: float = 3600.0
    failure_ttl_s: float = 10.0
    enabled: bool = True


@dataclass(frozen=True)
class _Failure:
    error: ToolError


class AsyncCache(Generic[V]):
    """`get_or_compute(key, compute)`: a cached value, a shared in-flight call, or a fresh one."""

    def __init__(
        self,
        name: str,
        settings: CacheSettings,
        metrics: ServiceMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.settings = settings
        self.metrics = metrics
        self._entries: TLRUCache[Hashable, V | _Failure] = TLRUCache(
            maxsize=settings.max_entries, ttu=self._expires_at, timer=clock
        )
        self._inflight: dict[Hashable, asyncio.Task[V]] = {}

    def _expires_at(self, _key: Hashable, value: V | _Failure, now: float) -> float:
        ttl = self.settings.failure_ttl_s if isinstance(value, _Failure) else self.settings.ttl_s
        return now + ttl

    def __len__(self) -> int:
        return len(self._entries)

    async def get_or_compute(
        self, key: Hashable, compute: Callable[[], Awaitable[V]]
    ) -> tuple[V, CacheOutcome]:
        """Raises the cached or fresh `ToolError` when the computation failed."""
        if not self.settings.enabled:
            self._count(hit=False)
            return await compute(), "miss"
        entry = self._entries.get(key)
        if entry is not None:
            self._count(hit=True)
            if isinstance(entry, _Failure):
                raise entry.error
            return entry, "hit"
        task = self._inflight.get(key)
        outcome: CacheOutcome = "shared"
        if task is None:
            outcome = "miss"
            task = asyncio.ensure_future(self._compute_and_store(key, compute))
            task.add_done_callback(_consume_exception)
            self._inflight[key] = task
        self._count(hit=outcome == "shared")
        # shield: one caller's deadline must not cancel the call the others are waiting for.
        return await asyncio.shield(task), outcome

    async def _compute_and_store(self, key: Hashable, compute: Callable[[], Awaitable[V]]) -> V:
        try:
            value = await compute()
        except DeadlineExceeded:
            raise
        except ToolError as error:
            self._entries[key] = _Failure(error)
            raise
        else:
            self._entries[key] = value
            return value
        finally:
            self._inflight.pop(key, None)

    def _count(self, hit: bool) -> None:
        if self.metrics is not None:
            counter = self.metrics.cache_hits if hit else self.metrics.cache_misses
            counter.labels(self.name).inc()


def _consume_exception(task: asyncio.Task[object]) -> None:
    # Every waiter may have left (deadline); retrieve the exception so asyncio does not warn.
    if not task.cancelled():
        task.exception()
