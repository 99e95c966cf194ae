"""An async cache with an entry bound, a byte bound and a TTL, that collapses concurrent
identical calls.

Why a byte bound: keys and values come from the model (a 500 KB query, a 9 MB page); counting
entries alone let 200 such queries hold 100 MB for an hour. Each entry is charged its key and
value as `sizeof` measures them, and the least recently used go first past `max_bytes`.

Why collapse: a GRPO group is 8-16 samples of one prompt, and they issue the same first searches
within milliseconds of each other. Without single-flight, each would miss the cache and pay the
upstream. Failures are cached too, briefly, so a broken page is not hammered by a whole group.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from cachetools import TLRUCache

from services.base.clock import SYSTEM_CLOCK, Now
from services.base.errors import DeadlineExceeded, ToolError
from services.serving.metrics import ServiceMetrics

V = TypeVar("V")
CacheOutcome = Literal["hit", "miss", "shared"]


@dataclass(frozen=True)
class CacheSettings:
    """Entries and bytes kept at most (LRU beyond), how long a value lives, how long a failure
    lives. A single value larger than `max_bytes` is served but not kept.

    `enabled=False` turns caching and call collapsing off (every call goes upstream), for
    debugging a provider and for measuring what the cache saves.
    """

    max_entries: int = 10_000
    max_bytes: int = 256 * 1024 * 1024
    ttl_s: float = 3600.0
    failure_ttl_s: float = 10.0
    enabled: bool = True


@dataclass(frozen=True)
class _Failure:
    error: ToolError


_FAILURE_BYTES = 1024  # an error object and its message, roughly


@dataclass(frozen=True)
class _Entry(Generic[V]):
    """A stored value and what it costs, its key included."""

    value: V | _Failure
    nbytes: int


def _entry_bytes(entry: _Entry[Any]) -> int:
    return entry.nbytes


def key_bytes(key: Hashable) -> int:
    """What a key holds: its strings, shallowly through tuples (our keys are tuples of str/int)."""
    if isinstance(key, tuple):
        return sys.getsizeof(key) + sum(key_bytes(part) for part in key)
    return sys.getsizeof(key)


class AsyncCache(Generic[V]):
    """`get_or_compute(key, compute)`: a cached value, a shared in-flight call, or a fresh one."""

    def __init__(
        self,
        name: str,
        settings: CacheSettings,
        metrics: ServiceMetrics | None = None,
        clock: Now = SYSTEM_CLOCK,
        sizeof: Callable[[V], int] = sys.getsizeof,
    ) -> None:
        self.name = name
        self.settings = settings
        self.metrics = metrics
        self._sizeof = sizeof
        self._entries: TLRUCache[Hashable, _Entry[V]] = TLRUCache(
            maxsize=settings.max_bytes, ttu=self._expires_at, timer=clock, getsizeof=_entry_bytes
        )
        self._inflight: dict[Hashable, asyncio.Task[V]] = {}

    def _expires_at(self, _key: Hashable, entry: _Entry[V], now: float) -> float:
        failed = isinstance(entry.value, _Failure)
        return now + (self.settings.failure_ttl_s if failed else self.settings.ttl_s)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        """What the kept entries cost, keys included (as `sizeof` measures values)."""
        return int(self._entries.currsize)

    def _store(self, key: Hashable, value: V | _Failure) -> None:
        size = key_bytes(key) + (
            _FAILURE_BYTES if isinstance(value, _Failure) else self._sizeof(value)
        )
        if size > self.settings.max_bytes:
            self._entries.pop(key, None)  # served, not kept: it alone would fill the cache
            return
        self._entries[key] = _Entry(value, size)
        while len(self._entries) > self.settings.max_entries:
            self._entries.popitem()

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
            if isinstance(entry.value, _Failure):
                raise entry.value.error
            return entry.value, "hit"
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
            self._store(key, _Failure(error))
            raise
        else:
            self._store(key, value)
            return value
        finally:
            self._inflight.pop(key, None)

    def _count(self, hit: bool) -> None:
        if self.metrics is not None:
            self.metrics.count_cache(self.name, hit)


def _consume_exception(task: asyncio.Task[object]) -> None:
    # Every waiter may have left (deadline); retrieve the exception so asyncio does not warn.
    if not task.cancelled():
        task.exception()
