"""The shared upstream client against a real HTTP server (pytest-httpserver) on loopback."""

import asyncio
import logging
import time

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from services.exceptions import (
    UpstreamAuthError,
    UpstreamBadResponse,
    UpstreamRateLimited,
    UpstreamUnavailable,
)
from services.http import RetryPolicy, Upstream, UpstreamSettings, parse_retry_after
from services.metrics import ServiceMetrics
from tests.helpers import wait_for_requests

FAST = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.02)


def upstream(httpserver: HTTPServer, **kwargs: object) -> Upstream:
    settings = UpstreamSettings(httpserver.url_for(""), retry=FAST, read_timeout_s=5)
    for key, value in kwargs.items():
        settings = UpstreamSettings(**{**settings.__dict__, key: value})
    return Upstream("fake", settings, metrics=ServiceMetrics("test"), key_hint="FAKE_KEY")


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 0.5 ") == 0.5
    assert parse_retry_after("-4") == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert parse_retry_after("soon") is None
    assert parse_retry_after(None) is None


@pytest.mark.anyio
async def test_429_with_retry_after_is_honoured_then_succeeds(httpserver: HTTPServer) -> None:
    httpserver.expect_ordered_request("/x").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "0.3"}
    )
    httpserver.expect_ordered_request("/x").respond_with_json({"ok": True})
    client = upstream(httpserver)
    started = time.monotonic()
    reply = await client.send("GET", "/x")
    assert reply.status_code == 200 and b'"ok": true' in reply.content
    assert time.monotonic() - started >= 0.3
    assert len(httpserver.log) == 2
    await client.aclose()


@pytest.mark.anyio
async def test_500_forever_gives_up_after_max_attempts(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/x").respond_with_data("boom", status=500)
    client = upstream(httpserver)
    with pytest.raises(UpstreamUnavailable, match="HTTP 500 after 4 attempts"):
        await client.send("GET", "/x")
    assert len(httpserver.log) == 4
    text = client.metrics.render().decode() if client.metrics else ""
    assert 'deepdive_test_upstream_calls_total{upstream="fake"} 4.0' in text
    assert (
        'deepdive_test_upstream_errors_total{kind="upstream_unavailable",upstream="fake"} 4.0'
        in text
    )
    await client.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("status", [401, 402, 403])
async def test_auth_errors_are_not_retried_and_reported_once(
    httpserver: HTTPServer, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    httpserver.expect_request("/x").respond_with_data("no", status=status)
    client = upstream(httpserver)
    with caplog.at_level(logging.ERROR, logger="deepdive.upstream"):
        for _ in range(3):
            with pytest.raises(UpstreamAuthError, match="check FAKE_KEY"):
                await client.send("GET", "/x")
    assert len(httpserver.log) == 3  # one request per call, never a retry
    assert len([r for r in caplog.records if "upstream_auth_failed" in r.message]) == 1
    assert client.auth_failure is not None and str(status) in client.auth_failure
    await client.aclose()


@pytest.mark.anyio
async def test_other_4xx_is_not_retried(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/x").respond_with_data("bad", status=400)
    client = upstream(httpserver)
    with pytest.raises(UpstreamBadResponse, match="HTTP 400"):
        await client.send("GET", "/x")
    assert len(httpserver.log) == 1
    await client.aclose()


@pytest.mark.anyio
async def test_retry_after_past_the_deadline_fails_fast(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/x").respond_with_data(
        "later", status=429, headers={"Retry-After": "5"}
    )
    client = upstream(httpserver)
    started = time.monotonic()
    with pytest.raises(UpstreamRateLimited, match="no time left"):
        await client.send("GET", "/x", deadline=time.monotonic() + 1.0)
    assert time.monotonic() - started < 0.5
    assert len(httpserver.log) == 1
    await client.aclose()


@pytest.mark.anyio
async def test_a_retry_after_over_the_cap_is_not_waited_for(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/x").respond_with_data(
        "later", status=429, headers={"Retry-After": "3600"}
    )
    client = upstream(httpserver)
    with pytest.raises(UpstreamRateLimited, match="too long"):
        await client.send("GET", "/x")
    await client.aclose()


@pytest.mark.anyio
async def test_slow_response_is_cut_at_the_deadline(httpserver: HTTPServer) -> None:
    def slow(_: Request) -> Response:
        time.sleep(1.5)
        return Response("late")

    httpserver.expect_request("/x").respond_with_handler(slow)
    client = upstream(httpserver)
    started = time.monotonic()
    with pytest.raises(UpstreamUnavailable, match="timed out"):
        await client.send("GET", "/x", deadline=time.monotonic() + 0.4)
    assert time.monotonic() - started < 1.2
    await client.aclose()
    wait_for_requests(httpserver, 1)


@pytest.mark.anyio
async def test_transport_errors_are_retried_then_reported() -> None:
    settings = UpstreamSettings("http://127.0.0.1:9", retry=FAST, connect_timeout_s=1)
    client = Upstream("closed", settings)
    with pytest.raises(UpstreamUnavailable, match="closed: could not connect after 4 attempts"):
        await client.send("GET", "/")
    await client.aclose()


@pytest.mark.anyio
async def test_oversized_responses_are_refused(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/x").respond_with_data("x" * 5000)
    client = upstream(httpserver, max_response_bytes=1000)
    with pytest.raises(UpstreamBadResponse, match="larger than 1000 bytes"):
        await client.send("GET", "/x")
    await client.aclose()


@pytest.mark.anyio
async def test_concurrency_is_bounded(httpserver: HTTPServer) -> None:
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
    client = upstream(httpserver, max_concurrency=2)
    await asyncio.gather(*(client.send("GET", "/x") for _ in range(8)))
    assert peak <= 2
    assert len(httpserver.log) == 8
    await client.aclose()


async def _raw_server(reply: bytes) -> tuple[asyncio.Server, list[int]]:
    """A server that reads a request's head, writes `reply` verbatim, then closes the socket:
    the malformed exchanges no well-behaved HTTP server library will produce."""
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        served.append(1)
        writer.write(reply)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    return await asyncio.start_server(handle, "127.0.0.1", 0), served


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
    server, served = await _raw_server(reply)
    port = server.sockets[0].getsockname()[1]
    client = Upstream("raw", UpstreamSettings(f"http://127.0.0.1:{port}", retry=FAST))
    with pytest.raises(UpstreamUnavailable) as caught:
        await client.send("GET", "/x")
    await client.aclose()
    server.close()
    await server.wait_closed()
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
    httpserver: HTTPServer,
) -> None:
    """Six calls under a bound of two: /metrics says 2 in flight and 4 waiting while the
    upstream is slow, and 0 and 0 once they are done (read at scrape time)."""

    def slow(_: Request) -> Response:
        time.sleep(0.4)
        return Response("{}", content_type="application/json")

    httpserver.expect_request("/slow").respond_with_handler(slow)
    client = upstream(httpserver, max_concurrency=2)
    assert client.metrics is not None
    calls = [asyncio.create_task(client.send("GET", "/slow")) for _ in range(6)]
    await asyncio.sleep(0.2)
    assert (_gauge(client.metrics, "in_flight"), _gauge(client.metrics, "waiting")) == (2, 4)
    await asyncio.gather(*calls)
    assert (_gauge(client.metrics, "in_flight"), _gauge(client.metrics, "waiting")) == (0, 0)
    await client.aclose()
