"""Slow clients and connection floods against a real uvicorn on loopback, over raw sockets: a
client that trickles its headers or body is cut off, app time is never counted, the connection
cap closes the extra sockets at once; and the start-up line brackets an IPv6 host.

When exactly a slow client is cut off is decided on a fake loop (test_connection_timers.py).
Here, on the real clock of a shared machine, a cut-off is awaited up to GIVE_UP_S (the failure
mode: never cut) and bounded by a third of that; those tests are marked slow."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import re
import resource
import select
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from services.base.errors import ConfigError
from services.serving.connections import ConnectionLimits
from services.serving.serve import (
    add_connection_options,
    add_server_arguments,
    announcer,
    bind,
    connection_limits,
    start_server_thread,
)
from slurm.cli import build_parser, main

Address = tuple[str, int]

GIVE_UP_S = 30.0  # a slow client still connected after this was never going to be cut off
BOUND_S = GIVE_UP_S / 3  # the latest a cut-off may come; a timer fires late, never early
TRICKLE_S = 0.3  # one byte per this many seconds: a slowloris client
SLOW_HEADERS = b"GET /hello HTTP/1.1\r\nHost: test\r\nX-Slow: " + b"a" * 100


async def hello(_: Request) -> PlainTextResponse:
    return PlainTextResponse("hi")


async def echo(request: Request) -> PlainTextResponse:
    try:
        body = await request.body()
    except ClientDisconnect:
        return PlainTextResponse("gone", status_code=400)  # nobody reads it: the client is gone
    return PlainTextResponse(str(len(body)))


async def slow(request: Request) -> PlainTextResponse:
    """Reads its body, then works longer than both timeouts."""
    body = await request.body()
    await asyncio.sleep(float(request.query_params["seconds"]))
    return PlainTextResponse(f"slept after {len(body)} bytes")


async def nap(request: Request) -> PlainTextResponse:
    """Works without reading anything, so uvicorn keeps reading paused for a pipelined request."""
    await asyncio.sleep(float(request.query_params["seconds"]))
    return PlainTextResponse("rested")


def make_app() -> Starlette:
    return Starlette(
        routes=[
            Route("/hello", hello),
            Route("/echo", echo, methods=["POST"]),
            Route("/slow", slow, methods=["POST"]),
            Route("/nap", nap),
        ]
    )


@contextmanager
def running(limits: ConnectionLimits, host: str = "127.0.0.1") -> Iterator[Address]:
    sock = bind(host, 0)
    stop = start_server_thread(make_app(), sock, limits)
    try:
        yield sock.getsockname()[:2]
    finally:
        stop()


def connect(stack: ExitStack, address: Address) -> socket.socket:
    return stack.enter_context(socket.create_connection(address, timeout=5))


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One response's status and body, reading no further (a pipelined answer may follow)."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += receive(sock, 1)
    match = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    assert match is not None, head
    return int(head.split(b" ", 2)[1]), receive(sock, int(match.group(1)))


def receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError(f"closed before a whole response: {data!r}")
        data += chunk
    return data


def get(sock: socket.socket, path: str = "/hello") -> tuple[int, bytes]:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    return read_response(sock)


def seconds_until_closed(sock: socket.socket, data: bytes, give_up_s: float) -> float | None:
    """Send `data` one byte per TRICKLE_S; the seconds until the server closed the connection,
    or None if it was still open after `give_up_s`."""
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < give_up_s:
        if sent < len(data):
            try:
                sock.sendall(data[sent : sent + 1])
            except OSError:  # reset by the server
                return time.monotonic() - start
            sent += 1
        readable, _, _ = select.select([sock], [], [], TRICKLE_S)
        if readable:
            try:
                chunk = sock.recv(1024)
            except ConnectionResetError:
                chunk = b""
            assert chunk == b"", f"expected the server to close, got {chunk!r}"
            return time.monotonic() - start
    return None


def closed_at_once(sock: socket.socket, within_s: float) -> bool:
    """True if the server closes `sock` (EOF or reset) within `within_s`, unasked."""
    sock.settimeout(within_s)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def log_lines(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(event + " ")]


def cut_off_in_time(elapsed: float | None, timeout_s: float, what: str) -> None:
    assert elapsed is not None, f"a client trickling its {what} was never cut off"
    assert 0.95 * timeout_s <= elapsed <= BOUND_S, elapsed


@pytest.fixture
def connection_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="services.serving.connections")
    return caplog


@pytest.mark.slow
def test_slowloris_headers_are_cut_off_at_the_header_timeout(
    connection_logs: pytest.LogCaptureFixture,
) -> None:
    limits = ConnectionLimits(header_timeout=1.0, body_timeout=60.0)
    with running(limits) as address, ExitStack() as stack:
        elapsed = seconds_until_closed(connect(stack, address), SLOW_HEADERS, GIVE_UP_S)
        cut_off_in_time(elapsed, 1.0, "headers")
        assert get(connect(stack, address)) == (200, b"hi")  # a normal client is unaffected
    [line] = log_lines(connection_logs, "slow_clients_closed")
    assert "headers=1 " in line and "body=" not in line
    assert "header_timeout_s=1.0" in line
    assert line.endswith("last_client=127.0.0.1")


@pytest.mark.slow
def test_slow_body_is_cut_off_at_the_body_timeout(
    connection_logs: pytest.LogCaptureFixture,
) -> None:
    limits = ConnectionLimits(header_timeout=1.0, body_timeout=1.0)
    headers = b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n"
    with running(limits) as address, ExitStack() as stack:
        sock = connect(stack, address)
        sock.sendall(headers)
        elapsed = seconds_until_closed(sock, b"x" * 1000, GIVE_UP_S)
        cut_off_in_time(elapsed, 1.0, "body")
        fast = connect(stack, address)
        fast.sendall(headers + b"x" * 1000)
        assert read_response(fast) == (200, b"1000")
    [line] = log_lines(connection_logs, "slow_clients_closed")
    assert line.startswith("slow_clients_closed body=1 ")


def test_app_time_is_not_counted_against_the_client() -> None:
    """A handler that works longer than both timeouts still answers, on a connection that stays
    usable for the next request."""
    limits = ConnectionLimits(header_timeout=0.5, body_timeout=0.5)
    body = b"x" * 10
    request = b"POST /slow?seconds=1.2 HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\n"
    with running(limits) as address, ExitStack() as stack:
        sock = connect(stack, address)
        start = time.monotonic()
        sock.sendall(request + body)
        assert read_response(sock) == (200, b"slept after 10 bytes")
        assert time.monotonic() - start >= 1.2
        assert get(sock) == (200, b"hi")


PIPELINED = b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 10\r\n\r\n" + b"x" * 10


@pytest.mark.slow
@pytest.mark.parametrize(
    ("split", "pause_s"),
    [
        pytest.param(PIPELINED.index(b"Host"), 0.8, id="headers"),
        pytest.param(len(PIPELINED) - 10, 0.2, id="body"),
    ],
)
def test_a_pipelined_request_waiting_for_its_turn_is_not_timed_out(
    split: int, pause_s: float
) -> None:
    """While the first request is served, the second one's time is the server's: its headers
    may wait (pause past the header timeout), and uvicorn stops reading its body (the bytes sit
    unread past the body timeout). The timer starts over instead of closing the connection.
    The first request naps 3 s: a pause that a loaded machine stretches by up to 2.5 s still
    ends while it is served (decided to the tick in test_connection_timers.py)."""
    limits = ConnectionLimits(header_timeout=0.5, body_timeout=0.5)
    first = b"GET /nap?seconds=3 HTTP/1.1\r\nHost: test\r\n\r\n"
    with running(limits) as address, ExitStack() as stack:
        sock = connect(stack, address)
        sock.sendall(first + PIPELINED[:split])
        time.sleep(pause_s)
        sock.sendall(PIPELINED[split:])
        assert read_response(sock) == (200, b"rested")
        assert read_response(sock) == (200, b"10")


def test_keep_alive_connection_serves_requests_in_a_row() -> None:
    """The header timeout runs from each request's first byte, not from the connection opening:
    an idle pause longer than it (but within uvicorn's 5 s keep-alive) is fine."""
    limits = ConnectionLimits(header_timeout=0.5, body_timeout=0.5)
    with running(limits) as address, ExitStack() as stack:
        sock = connect(stack, address)
        assert get(sock) == (200, b"hi")
        time.sleep(0.8)
        assert get(sock) == (200, b"hi")
        assert get(sock) == (200, b"hi")


@pytest.mark.slow
def test_trickle_after_a_served_request_is_cut_off() -> None:
    """Blank lines between requests start no message in llhttp: a client must not keep a
    keep-alive connection open by trickling them (each byte also resets uvicorn's keep-alive)."""
    limits = ConnectionLimits(header_timeout=0.6, body_timeout=10.0)
    with running(limits) as address, ExitStack() as stack:
        sock = connect(stack, address)
        assert get(sock) == (200, b"hi")
        elapsed = seconds_until_closed(sock, b"\r\n" * 10 + SLOW_HEADERS, GIVE_UP_S)
        cut_off_in_time(elapsed, 0.6, "blank lines on a keep-alive connection")


def test_connections_past_the_cap_are_closed_at_once(
    connection_logs: pytest.LogCaptureFixture,
) -> None:
    cap = 3
    # an admitted socket left alone would be closed at the header timeout: far past the wait
    limits = ConnectionLimits(
        header_timeout=GIVE_UP_S, max_connections=cap, max_connections_per_client=cap
    )
    with running(limits) as address, ExitStack() as stack:
        admitted = [connect(stack, address) for _ in range(cap)]
        for sock in admitted:  # answered: the server has counted each of them
            assert get(sock) == (200, b"hi")
        extra = [connect(stack, address) for _ in range(2)]
        for sock in extra:
            assert closed_at_once(sock, within_s=BOUND_S)
        for sock in admitted:
            assert get(sock) == (200, b"hi")
        for sock in admitted[:2]:
            sock.close()
        assert served_on_a_new_connection(stack, address)
        assert served_on_a_new_connection(stack, address)
    # two refused, counted, not logged one by one: at once or with the line written at
    # shutdown (both arrive in one accepting pass when the loop is slow to get to them)
    lines = log_lines(connection_logs, "connections_refused")
    counts = [line.split()[1] for line in lines]
    assert counts in (["server_full=1", "server_full=1"], ["server_full=2"]), counts
    assert f"open={cap} max_connections={cap}" in lines[0]


def served_on_a_new_connection(stack: ExitStack, address: Address) -> bool:
    """A request on a fresh connection, retried while the server catches up with the closes."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        sock = connect(stack, address)
        try:
            if get(sock) == (200, b"hi"):
                return True
        except (ConnectionError, TimeoutError):
            sock.close()
        time.sleep(0.05)
    return False


def ipv6_loopback_available() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback on this machine")
def test_announce_brackets_an_ipv6_host(capsys: pytest.CaptureFixture[str]) -> None:
    with running(ConnectionLimits(), host="::1") as (host, port):
        announcer("test server", None, ["try: curl {base}/hello"])(host, port)
        err = capsys.readouterr().err
        base = f"http://[::1]:{port}"
        assert f"test server listening on {base}\n" in err
        assert f"try: curl {base}/hello\n" in err
        match = re.search(r"listening on (\S+)", err)
        assert match is not None
        with httpx.Client(trust_env=False) as client:  # the printed URL works as printed
            assert client.get(match.group(1) + "/hello").text == "hi"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("header_timeout", 0),
        ("header_timeout", True),
        ("body_timeout", -1.0),
        ("body_timeout", math.nan),
        ("body_timeout", math.inf),
        ("max_connections", 0),
        ("max_connections", 2.5),
    ],
)
def test_an_invalid_limit_is_a_config_error_naming_the_field(field: str, value: object) -> None:
    kwargs: dict[str, Any] = {field: value}
    with pytest.raises(ConfigError, match=rf"^{field}: expected a positive"):
        ConnectionLimits(**kwargs)


def test_server_options_become_limits() -> None:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser, 0)
    add_connection_options(parser)
    assert connection_limits(parser.parse_args([])) == ConnectionLimits()
    args = ["--header-timeout", "2.5", "--body-timeout", "7", "--max-connections", "9"]
    assert connection_limits(parser.parse_args(args)) == ConnectionLimits(2.5, 7.0, 9)
    engine = build_parser().parse_args(["serve", "engine", "--model", "m", *args])
    assert connection_limits(engine) == ConnectionLimits(2.5, 7.0, 9)


@pytest.mark.parametrize("service", ["tools", "reward"])
def test_deepdive_serve_refuses_a_bad_limit_before_starting(
    service: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", service, "--port", "0", "--connections.max-connections", "0"]) == 2
    assert "connections.max_connections: expected a positive whole number, got 0" in (
        capsys.readouterr().err
    )


SERVE_SCRIPT = textwrap.dedent(
    """
    import sys
    from starlette.applications import Starlette
    from services.serving.connections import ConnectionLimits
    from services.base.logs import configure_logging
    from services.serving.serve import bind, serve

    configure_logging("INFO")
    sock = bind("127.0.0.1", 0)
    limits = ConnectionLimits(header_timeout=0.5, body_timeout=0.5, max_connections=8)
    serve(Starlette(), sock, on_listening=lambda host, port: print(port, flush=True), limits=limits)
    """
)


@pytest.mark.slow
def test_serve_applies_the_limits_too() -> None:
    """`serve()` (the CLI servers) as well as `start_server_thread()`: a real process."""
    process = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        with ExitStack() as stack:
            sock = connect_when_listening(stack, ("127.0.0.1", port))
            elapsed = seconds_until_closed(sock, SLOW_HEADERS, GIVE_UP_S)
            cut_off_in_time(elapsed, 0.5, "headers")
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert "slow_clients_closed headers=1 " in stderr


def connect_when_listening(stack: ExitStack, address: Address) -> socket.socket:
    """`on_listening` runs just before uvicorn calls listen(): retry a refused connect briefly."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return connect(stack, address)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


FD_SCRIPT = textwrap.dedent(
    """
    import resource
    from services.serving.connections import FD_HEADROOM, ensure_fd_limit
    from services.base.logs import configure_logging

    configure_logging("INFO")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    ensure_fd_limit(1024)
    print(resource.getrlimit(resource.RLIMIT_NOFILE)[0] - FD_HEADROOM, flush=True)
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))
    ensure_fd_limit(1024)
    """
)


@pytest.mark.skipif(
    resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 4096, reason="hard open-files limit too low"
)
def test_serve_raises_the_open_files_limit_to_cover_the_cap() -> None:
    """Past the open-files limit accept() fails before the cap is ever reached; in its own
    process, since the limit is process-wide."""
    result = subprocess.run(
        [sys.executable, "-c", FD_SCRIPT], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.split() == ["1024"]
    assert "open_files_limit_raised old=256 new=1536" in result.stderr
    assert "open_files_limit_low limit=300 max_connections=1024" in result.stderr
