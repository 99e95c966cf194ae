import asyncio

import pytest

from services.base.errors import DeadlineExceeded, UpstreamUnavailable
from services.cache import AsyncCache, CacheSettings
from services.serving.metrics import ServiceMetrics
from tests.helpers import FakeClock


@pytest.mark.anyio
async def test_concurrent_identical_calls_collapse_into_one() -> None:
    calls = 0

    async def compute() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return "value"

    cache: AsyncCache[str] = AsyncCache("t", CacheSettings())
    results = await asyncio.gather(*(cache.get_or_compute("k", compute) for _ in range(16)))
    assert calls == 1
    assert [value for value, _ in results] == ["value"] * 16
    assert sorted(outcome for _, outcome in results) == ["miss"] + ["shared"] * 15
    assert await cache.get_or_compute("k", compute) == ("value", "hit")
    assert calls == 1


@pytest.mark.anyio
async def test_entries_expire_after_ttl() -> None:
    clock = FakeClock(now=0.0)
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        return calls

    cache: AsyncCache[int] = AsyncCache("t", CacheSettings(ttl_s=10), clock=clock)
    assert await cache.get_or_compute("k", compute) == (1, "miss")
    clock.now = 9.9
    assert await cache.get_or_compute("k", compute) == (1, "hit")
    clock.now = 10.1
    assert await cache.get_or_compute("k", compute) == (2, "miss")


@pytest.mark.anyio
async def test_size_bound_evicts_least_recently_used() -> None:
    async def compute() -> str:
        return "v"

    cache: AsyncCache[str] = AsyncCache("t", CacheSettings(max_entries=3))
    for key in "abcd":
        await cache.get_or_compute(key, compute)
    assert len(cache) == 3
    assert (await cache.get_or_compute("a", compute))[1] == "miss"


@pytest.mark.anyio
async def test_failures_are_cached_briefly_then_retried() -> None:
    clock = FakeClock(now=0.0)
    calls = 0

    async def failing() -> str:
        nonlocal calls
        calls += 1
        raise UpstreamUnavailable("serper", "HTTP 503")

    metrics = ServiceMetrics("test")
    cache: AsyncCache[str] = AsyncCache(
        "t", CacheSettings(ttl_s=100, failure_ttl_s=5), metrics=metrics, clock=clock
    )
    for _ in range(3):
        with pytest.raises(UpstreamUnavailable):
            await cache.get_or_compute("k", failing)
    assert calls == 1
    clock.now = 6
    with pytest.raises(UpstreamUnavailable):
        await cache.get_or_compute("k", failing)
    assert calls == 2
    text = metrics.render().decode()
    assert 'deepdive_test_cache_hits_total{cache="t"} 2.0' in text
    assert 'deepdive_test_cache_misses_total{cache="t"} 2.0' in text


@pytest.mark.anyio
async def test_deadline_failures_are_not_cached() -> None:
    calls = 0

    async def slow() -> str:
        nonlocal calls
        calls += 1
        raise DeadlineExceeded("too slow")

    cache: AsyncCache[str] = AsyncCache("t", CacheSettings())
    for _ in range(2):
        with pytest.raises(DeadlineExceeded):
            await cache.get_or_compute("k", slow)
    assert calls == 2


@pytest.mark.anyio
async def test_a_cancelled_waiter_does_not_cancel_the_shared_call() -> None:
    """The call is held until the first waiter is cancelled (not for 50 ms of real time, which
    a loaded machine could spend before the cancel, leaving nothing to test)."""
    started, finish = asyncio.Event(), asyncio.Event()

    async def compute() -> str:
        started.set()
        await finish.wait()
        return "done"

    cache: AsyncCache[str] = AsyncCache("t", CacheSettings())
    impatient = asyncio.ensure_future(cache.get_or_compute("k", compute))
    patient = asyncio.ensure_future(cache.get_or_compute("k", compute))
    await started.wait()
    impatient.cancel()
    await asyncio.sleep(0)  # the cancellation is delivered while the call is in flight
    assert impatient.cancelled()
    finish.set()
    assert await patient == ("done", "shared")
    assert await cache.get_or_compute("k", compute) == ("done", "hit")


@pytest.mark.anyio
async def test_a_disabled_cache_always_computes() -> None:
    calls = 0

    async def compute() -> int:
        nonlocal calls
        calls += 1
        return calls

    cache: AsyncCache[int] = AsyncCache("t", CacheSettings(enabled=False))
    assert [await cache.get_or_compute("k", compute) for _ in range(3)] == [
        (1, "miss"),
        (2, "miss"),
        (3, "miss"),
    ]
    assert len(cache) == 0


@pytest.mark.anyio
async def test_the_byte_bound_counts_keys_and_values_and_evicts_lru() -> None:
    # Model-chosen keys and values once had no byte bound: 200 queries of 500 KB held 107 MB.
    big = "v" * 10_000

    async def compute() -> str:
        return big

    cache: AsyncCache[str] = AsyncCache("t", CacheSettings(max_bytes=100_000))
    for i in range(50):
        await cache.get_or_compute(("query", str(i) * 1000), compute)
        assert cache.nbytes <= 100_000
    assert 0 < len(cache) < 10  # ~11 KB an entry, key included
    assert (await cache.get_or_compute(("query", "49" * 1000), compute))[1] == "hit"
    assert (await cache.get_or_compute(("query", "0" * 1000), compute))[1] == "miss"


@pytest.mark.anyio
async def test_a_value_larger_than_the_whole_cache_is_served_not_kept() -> None:
    async def compute() -> str:
        return "x" * 200_000

    cache: AsyncCache[str] = AsyncCache("t", CacheSettings(max_bytes=100_000))
    value, outcome = await cache.get_or_compute("k", compute)
    assert len(value) == 200_000 and outcome == "miss"
    assert len(cache) == 0 and cache.nbytes == 0
    assert (await cache.get_or_compute("k", compute))[1] == "miss"
