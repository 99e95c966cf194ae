"""The shared upstream client against a real HTTP server (pytest-httpserver) on loopback. Its
backoffs and deadlines are decided on a FakeClock (what it would sleep, not how long a sleep
took); one end-to-end deadline, on the real clock, is marked slow."""

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import aclosing, asynccontextmanager, contextmanager

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from services.base.clock import SYSTEM_CLOCK, Clock
from services.base.errors import (
    UpstreamAuthError,
    UpstreamBadResponse,
    UpstreamRateLimited,
    UpstreamUnavailable,
)
from services.client.http import Upstream, UpstreamSettings
from services.client.retries import RetryPolicy, parse_retry_after
from services.serving.metrics import ServiceMetrics
from tests.helpers import FakeClock, wait_for_requests

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.02)

MakeUpstream = Callable[..., Upstream]


@pytest.fixture
async def upstream(httpserver: HTTPServer) -> AsyncIterator[MakeUpstream]:
    """Makes clients of the fake server (settings overridden by keyword), each closed after the
    test, whatever it asserted."""
    made: list[Upstream] = []

    def make(*, clock: Clock = SYSTEM_CLOCK, **kwargs: object) -> Upstream:
        settings = UpstreamSettings(httpserver.url_for(""), retry=FAST, read_timeout_s=5)
        settings = UpstreamSettings(**{**settings.__dict__, **kwargs})
        made.append(
            Upstream(
                "fake", settings, metrics=ServiceMetrics("test"), key_hint="FAKE_KEY", clock=clock
            )
        )
        return made[-1]

    yield make
    for client in made:
        await client.aclose()


@contextmanager
def held_until_released(httpserver: HTTPServer, path: str) -> Iterator[threading.Event]:
    """`path` answers only once the event is set (set on the way out, so no handler outlives
    the test): an upstream as slow as the test needs, never slower."""
    release = threading.Event()

    def held(_: Request) -> Response:
        release.wait(60)
        return Response("{}", content_type="application/json")

    httpserver.expect_request(path).respond_with_handler(held)
    try:
        yield release
    finally:
        release.set()


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


@pytest.mark.anyio
async def test_429_with_retry_after_is_honoured_then_succeeds(
    httpserver: HTTPServer, upstream: MakeUpstream
) -> None:
    httpserver.expect_ordered_request("/x").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "0.3"}
    )
    httpserver.expect_ordered_request("/x").respond_with_json({"ok": True})
    clock = FakeClock()
    client = upstream(clock=clock)
    reply = await client.send("GET", "/x")
    assert reply.status_code == 200 and b'"ok": true' in reply.content
    assert clock.sleeps == [0.3]  # the advertised wait, not the policy's ~10 ms
    assert len(httpserver.log) == 2


@pytest.mark.anyio
async def test_500_forever_gives_up_after_max_attempts(
    httpserver: HTTPServer, upstream: MakeUpstream
) -> None:
    httpserver.expect_request("/x").respond_with_data("boom", status=500)
    clock = FakeClock()
    client = upstream(clock=clock)
    with pytest.raises(UpstreamUnavailable, match="HTTP 500 after 4 attempts"):
        await client.send("GET", "/x")
    assert len(httpserver.log) == 4
    assert len(clock.sleeps) == 3  # a backoff before each retry, none after the last
    assert all(0 <= s <= FAST.backoff_cap(k) for k, s in enumerate(clock.sleeps, 1)), clock.sleeps
    text = client.metrics.render().decode() if client.metrics else ""
    assert 'deepdive_test_upstream_calls_total{upstream="fake"} 4.0' in text
    assert (
        'deepdive_test_upstream_errors_total{kind="upstream_unavailable",upstream="fake"} 4.0'
        in text
    )


def test_the_backoff_doubles_from_its_base_up_to_its_cap_with_full_jitter() -> None:
    policy = RetryPolicy(base_delay_s=0.25, max_delay_s=8.0)
    caps = [policy.backoff(k, draw=lambda: 1.0) for k in range(1, 9)]
    assert caps == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert [policy.backoff(k, draw=lambda: 0.5) for k in (1, 3)] == [0.125, 0.5]
    assert all(0 <= policy.backoff(4) < 2.0 for _ in range(200))  # random.random by default


@pytest.mark.anyio
async def test_no_backoff_is_slept_past_the_deadline(
    httpserver: HTTPServer, upstream: MakeUpstream
) -> None:
    httpserver.expect_request("/x").respond_with_data("boom", status=500)
    clock = FakeClock()
    client = upstream(clock=clock, retry=RetryPolicy(max_attempts=50, base_delay_s=1.0))
    deadline = clock() + 2.5
    with pytest.raises(UpstreamUnavailable, match="no time left to retry within the deadline"):
        await client.send("GET", "/x", deadline=deadline)
    assert clock.sleeps and clock.now < deadline


@pytest.mark.anyio
@pytest.mark.parametrize("status", [401, 402, 403])
async def test_auth_errors_are_not_retried_and_reported_once(
    httpserver: HTTPServer, upstream: MakeUpstream, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    httpserver.expect_request("/x").respond_with_data("no", status=status)
    client = upstream()
    with caplog.at_level(logging.ERROR, logger="deepdive.upstream"):
        for _ in range(3):
            with pytest.raises(UpstreamAuthError, match="check FAKE_KEY"):
                await client.send("GET", "/x")
    assert len(httpserver.log) == 3  # one request per call, never a retry
    assert len([r for r in caplog.records if "upstream_auth_failed" in r.message]) == 1
    assert client.auth_failure is not None and str(status) in client.auth_failure


@pytest.mark.anyio
async def test_other_4xx_is_not_retried(httpserver: HTTPServer, upstream: MakeUpstream) -> None:
    httpserver.expect_request("/x").respond_with_data("bad", status=400)
    client = upstream()
    with pytest.raises(UpstreamBadResponse, match="HTTP 400"):
        await client.send("GET", "/x")
    assert len(httpserver.log) == 1


@pytest.mark.anyio
async def test_retry_after_past_the_deadline_fails_fast(
    httpserver: HTTPServer, upstream: MakeUpstream
) -> None:
    httpserver.expect_request("/x").respond_with_data(
        "later", status=429, headers={"Retry-After": "5"}
    )
    clock = FakeClock()
    client = upstream(clock=clock)
    with pytest.raises(UpstreamRateLimited, match="no time left"):
        await client.send("GET", "/x", deadline=clock() + 1.0)
    assert clock.sleeps == []  # the 5 s were never waited
    assert len(httpserver.log) == 1


@pytest.mark.anyio
async def test_a_retry_after_over_the_cap_is_not_waited_for(
    httpserver: HTTPServer, upstream: MakeUpstream
) -> None:
    httpserver.expect_request("/x").respond_with_data(
        "later", status=429, headers={"Retry-After": "3600"}
    )
    clock = FakeClock()
    client = upstream(clock=clock)
    with pytest.raises(UpstreamRateLimited, match="too long"):
        await client.send("GET", "/x")
    assert clock.sleeps == []


@pytest.mark.slow
@pytest.mark.anyio
async def test_slow_response_is_cut_at_the_deadline(
    httpserver: HTTPServer, upstream: MakeUpstream
) -> None:
    """End to end on the real clock: an upstream that answers only after the test cannot cut
    the call; without the deadline the read timeout (30 s) would, so the bound is a third."""
    client = upstream(read_timeout_s=30)
    with held_until_released(httpserver, "/x"):
        started = time.monotonic()
        with pytest.raises(UpstreamUnavailable, match="timed out"):
            await client.send("GET", "/x", deadline=time.monotonic() + 0.4)
        assert time.monotonic() - started < 10
    wait_for_requests(httpserver, 1)


@pytest.mark.anyio
async def test_transport_errors_are_retried_then_reported() -> None:
    settings = UpstreamSettings("http://127.0.0.1:9", retry=FAST, connect_timeout_s=1)
    async with aclosing(Upstream("closed", settings)) as client:
        with pytest.raises(
            UpstreamUnavailable,
            match="closed: could not connect: connection refused after 4 attempts",
        ):
            await client.send("GET", "/")


@pytest.mark.anyio
async def test_oversized_responses_are_refused(
    httpserver: HTTPServer, upstream: MakeUpstream
) -> None:
    httpserver.expect_request("/x").respond_with_data("x" * 5000)
    client = upstream(max_response_bytes=1000)
    with pytest.raises(UpstreamBadResponse, match="larger than 1000 bytes"):
        await client.send("GET", "/x")


@pytest.mark.anyio
async def test_concurrency_is_bounded(httpserver: HTTPServer, upstream: MakeUpstream) -> None:
    import asyncio
    import threading

    active = 0
    peak = 0
    lock = threading.Lock()

    def handler(_: Request) -> Response:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.05)
        with lock:
            active -= 1
        return Response("ok")

    httpserver.expect_request("/x").respond_with_handler(handler)
    client = upstream(max_concurrency=2)
    await asyncio.gather(*(client.send("GET", "/x") for _ in range(8)))
    assert peak <= 2
    assert len(httpserver.log) == 8


@asynccontextmanager
async def _raw_server(reply: bytes) -> AsyncIterator[tuple[int, list[int]]]:
    """A server (its port) that reads a request's head, writes `reply` verbatim, then closes
    the socket: the malformed exchanges no well-behaved HTTP server library will produce."""
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        served.append(1)
        writer.write(reply)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], served
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            + b'{"organic"',
            "the connection closed before the response was complete",
        ),
        (b"", "the server closed the connection"),
    ],
    ids=["truncated_body", "no_response"],
)
async def test_transport_failures_read_as_plain_words(reply: bytes, words: str) -> None:
    async with _raw_server(reply) as (port, served):
        settings = UpstreamSettings(f"http://127.0.0.1:{port}", retry=FAST)
        async with aclosing(Upstream("raw", settings)) as client:
            with pytest.raises(UpstreamUnavailable) as caught:
                await client.send("GET", "/x")
    assert caught.value.message == f"raw: {words} after {FAST.max_attempts} attempts"
    # still a transport error, so retried (aiohttp itself retries an idempotent request once
    # when the server hangs up without a word, hence "at least")
    assert len(served) >= FAST.max_attempts


def _gauge(metrics: ServiceMetrics, name: str) -> float:
    for line in metrics.render().decode().splitlines():
        if line.startswith(f"deepdive_test_upstream_{name}{{") and 'upstream="fake"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} gauge for upstream fake")


@pytest.mark.anyio
async def test_metrics_show_calls_in_flight_and_waiting_under_the_bound(
    httpserver: HTTPServer, upstream: MakeUpstream
) -> None:
    """Six calls under a bound of two: /metrics says 2 in flight and 4 waiting while the
    upstream holds them (until the test lets go, not for a time a loaded machine may outlast),
    and 0 and 0 once they are done (read at scrape time)."""
    arrived = threading.Semaphore(0)
    release = threading.Event()

    def held(_: Request) -> Response:
        arrived.release()
        release.wait(60)
        return Response("{}", content_type="application/json")

    httpserver.expect_request("/slow").respond_with_handler(held)
    client = upstream(max_concurrency=2)
    assert client.metrics is not None
    calls = [asyncio.create_task(client.send("GET", "/slow")) for _ in range(6)]
    try:
        # the first call reached the upstream: every call has been started (the fake upstream
        # serves one request at a time, so only the first is in its handler)
        assert await asyncio.to_thread(arrived.acquire, timeout=30)
        assert (_gauge(client.metrics, "in_flight"), _gauge(client.metrics, "waiting")) == (2, 4)
    finally:
        release.set()
        await asyncio.gather(*calls)
    assert (_gauge(client.metrics, "in_flight"), _gauge(client.metrics, "waiting")) == (0, 0)
