"""The supervisor's health ping (services/serving/workers.py) against real sockets: only a 200
is an answer; a worker that replies 503 or bytes that are not HTTP misses its pings and is
killed as frozen, by a real supervisor over a real forked worker; a stop does not wait for a
ping still in flight."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.serving.supervision import SupervisionPolicy
from services.serving.workers import WorkerExited, WorkerSlot, bind_workers, ping_health, supervise

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n" + b'{"status":"ok"}'
UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
GARBAGE = b"garbage, not HTTP\r\n\r\n"
ROOT = Path(__file__).resolve().parents[2]


def answer_forever(sock: socket.socket, reply: bytes | None) -> None:
    """Answer every connection with `reply` (None: read the request, never answer)."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:
            return  # the test closed the socket
        conn.recv(4096)
        if reply is None:
            continue  # held open, unanswered: a frozen loop
        conn.sendall(reply)
        conn.close()


@contextmanager
def replying(reply: bytes | None) -> Iterator[tuple[str, int]]:
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=answer_forever, args=(sock, reply), daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[:2]
    finally:
        sock.close()


def test_only_a_200_is_an_answer() -> None:
    with replying(OK) as address:
        assert ping_health(address, timeout_s=10)
    for reply in (UNAVAILABLE, GARBAGE, b""):
        with replying(reply) as address:
            assert not ping_health(address, timeout_s=10), reply


def test_no_reply_within_the_timeout_and_a_refusal_are_misses() -> None:
    with replying(None) as address:
        assert not ping_health(address, timeout_s=0.2)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: refused
        assert not ping_health(closed.getsockname()[:2], timeout_s=10)


def serve_replying(reply: bytes | None) -> None:
    """A supervisor over one worker that says it serves, then replies `reply` to everything;
    no restart allowed, so the first worker found frozen ends the supervisor (status 3)."""
    policy = SupervisionPolicy(
        max_restarts=0, ping_interval_s=0.1, ping_timeout_s=30.0, missed_pings=2
    )

    def serve(slot: WorkerSlot, sock: socket.socket) -> None:
        slot.serving()
        print("serving", flush=True)
        answer_forever(sock, reply)

    try:
        supervise(bind_workers("127.0.0.1", 0, 1), serve, "test", policy)
    except WorkerExited as error:
        print(error.message, flush=True)
        sys.exit(3)


def supervisor(arguments: str) -> subprocess.Popen[str]:
    code = f"from tests.services.test_health_ping import *; serve_replying({arguments})"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.parametrize("reply", ["UNAVAILABLE", "GARBAGE"])
def test_a_worker_that_replies_but_not_200_is_killed_as_frozen(reply: str) -> None:
    process = supervisor(reply)
    out, _ = process.communicate(timeout=60)  # ~0.3 s; a 503 taken as an answer runs forever
    assert process.returncode == 3, out
    assert "test worker 0 (http://127.0.0.1:" in out
    assert "did not answer /health 2 times in a row (30 s each)" in out


def test_a_stop_does_not_wait_for_a_ping_in_flight() -> None:
    """The worker never answers, each ping may take 30 s: SIGTERM still ends the supervisor
    as soon as its worker has stopped, by that signal. The selector-driven ping before crashed
    here (ValueError, exit status 1): the worker's end and its ping's EOF came in one select,
    and the ping's socket, closed for the ended worker, was then looked up in the selector."""
    process = supervisor("None")
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "serving\n"
        time.sleep(0.5)  # pings sent every 0.1 s: one is in flight, unanswered
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert time.monotonic() - started < 10  # a ping waited on would take 30 s
        assert process.returncode == -signal.SIGTERM
    finally:
        process.kill()
        process.communicate()  # closes its pipe
