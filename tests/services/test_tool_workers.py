"""`deepdive serve tools --workers N`: a supervisor and N worker processes, each on its own
port, for real (processes, HTTP on loopback): every worker answers, a stop reaches them all; a
worker killed under load is started again on the same port (which never stops listening), its
sessions' clicks answer session_lost; a frozen worker (SIGSTOP) is found by its missed pings and
replaced; restarts past the bound end the whole server with a non-zero status."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from deepdive.clients import close_clients
from deepdive.generate import call_tool
from deepdive.protocol import ToolCall, ToolReply
from deepdive.rollout_settings import RolloutSettings
from services.base.process import ServiceProcess
from services.base.waiting import wait_for
from services.serving.workers import MAX_DEFAULT_WORKERS, default_workers
from tests.helpers import worker_pids

pytestmark = pytest.mark.slow


def tool_server(corpus: Path, log: Path, *extra: str, port: int = 0) -> ServiceProcess:
    arguments = ["tools", "--corpus", str(corpus), "--index-cache", "false", "--log-level", "INFO"]
    return ServiceProcess("tools", [*arguments, *extra], log, ready_timeout_s=60, port=port)


def consecutive_free_ports(count: int) -> int:
    """A port P with P .. P+count-1 free now (the server binds them moments later)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first: int = probe.getsockname()[1]
        if first + count > 65_000:
            continue
        holders = []
        try:
            for port in range(first, first + count):
                holder = socket.socket()
                holders.append(holder)
                holder.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for holder in holders:
                holder.close()
    raise AssertionError("no run of free ports found")


def test_every_worker_answers_on_its_own_port_and_a_stop_reaches_them_all(
    corpus_file: Path, tmp_path: Path
) -> None:
    first = consecutive_free_ports(2)
    server = tool_server(corpus_file, tmp_path / "tools.log", "--workers", "2", port=first)
    with server:
        assert server.urls == [f"http://127.0.0.1:{first}", f"http://127.0.0.1:{first + 1}"]
        for url in server.urls:
            assert httpx.get(f"{url}/health").json() == {"status": "ok"}
            assert httpx.get(f"{url}/ready").status_code == 200
        assert server.process is not None
        supervisor = server.process.pid
        workers = worker_pids(supervisor)
        assert len(workers) == 2 and supervisor not in workers  # a process each
        log = (tmp_path / "tools.log").read_text()
        assert log.count("listening on ") == 1  # the supervisor's line only, every URL in it
        server.process.send_signal(signal.SIGTERM)
        status = server.process.wait(timeout=30)
    assert status == -signal.SIGTERM  # ends as one server does: uvicorn re-raises the signal
    assert not any(running(pid) for pid in workers)
    assert (tmp_path / "tools.log").read_text().count("Application shutdown complete") == 2


def running(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def tool_call(url: str, session: str, name: str, **arguments: object) -> dict[str, Any]:
    body = {"session_id": session, "name": name, "arguments": arguments}
    response = httpx.post(f"{url}/tool", json=body, timeout=30)
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


def restarts_counted(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("deepdive_tool_worker_restarts_total"))
    return float(line.split()[-1])


def replaced(supervisor: int, *old: int) -> int | None:
    """The pid of a worker the supervisor started after `old` (every worker it had), if any."""
    fresh = [pid for pid in worker_pids(supervisor) if pid not in old]
    return fresh[0] if fresh else None


@contextmanager
def load(url: str) -> Iterator[list[bool]]:
    """Searches sent back to back to `url` from a thread until the block ends: each outcome."""
    outcomes: list[bool] = []
    done = threading.Event()

    def send() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                body = {"session_id": "load", "name": "search", "arguments": {"query": "Vorn"}}
                try:
                    outcomes.append(client.post(f"{url}/tool", json=body).status_code == 200)
                except httpx.TransportError:
                    outcomes.append(False)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield outcomes
    finally:
        done.set()
        thread.join(timeout=60)


def test_a_killed_worker_is_restarted_on_its_port_and_its_sessions_are_told_they_are_lost(
    corpus_file: Path, tmp_path: Path
) -> None:
    log = tmp_path / "tools.log"
    with tool_server(corpus_file, log, "--workers", "2") as server:
        assert server.process is not None
        supervisor = server.process.pid
        victim, survivor = worker_pid(log, 0), worker_pid(log, 1)
        url = server.urls[0]
        tool_call(url, "before", "search", query="orrery")  # a session the old worker served
        assert "error" not in tool_call(url, "before", "click", link_id=1)
        with load(url) as outcomes:
            wait_for(lambda: len(outcomes) >= 5, timeout_s=30, what="the load")
            os.kill(victim, signal.SIGKILL)
            # the port still listens: a connection made now is answered by the replacement
            waiting = socket.create_connection(("127.0.0.1", port_of(url)), timeout=5)
            fresh = wait_for(
                lambda: replaced(supervisor, victim, survivor), timeout_s=60, what="a new worker"
            )
            served = len(outcomes)
            wait_for(lambda: any(outcomes[served:]), timeout_s=60, what="the load served again")
        with waiting:
            waiting.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            waiting.settimeout(60)
            assert waiting.recv(64).startswith(b"HTTP/1.1 200")
        assert set(worker_pids(supervisor)) == {fresh, survivor}
        lost = tool_call(url, "before", "click", link_id=1)
        assert lost["error"]["code"] == "session_lost", lost
        assert "search again" in lost["observation"]
        # a session this worker has not served may have searched in the old one: lost too
        assert tool_call(url, "after", "click", link_id=1)["error"]["code"] == "session_lost"
        tool_call(url, "before", "search", query="orrery")
        assert "error" not in tool_call(url, "before", "click", link_id=1)
        assert tool_call(url, "before", "click", link_id=99)["error"]["code"] == "invalid_link_id"
        assert restarts_counted(url) == 1
        assert restarts_counted(server.urls[1]) == 0
        assert tool_call(server.urls[1], "other", "click", link_id=1)["error"]["code"] == (
            "invalid_link_id"  # the other worker was never replaced: nothing of its was lost
        )
    text = log.read_text()
    assert "worker_exited worker=0" in text and 'reason="exited with status -9"' in text
    assert "worker_restarted worker=0" in text


def worker_pid(log: Path, index: int) -> int:
    """The pid of worker `index` (its port is server.urls[index]), from its start-up line.

    The line may reach the log after the worker answered /ready: a service's log handler
    writes its lines in batches, up to 0.1 s late (services/base/logs.py BufferedStreamHandler)."""

    def started() -> int | None:
        found = re.findall(rf"worker_started worker={index} \S+ pid=(\d+)", log.read_text())
        return int(found[-1]) if found else None

    return wait_for(started, timeout_s=30, what=f"the start-up line of worker {index}")


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_a_frozen_worker_is_found_by_its_missed_pings_and_replaced(
    corpus_file: Path, tmp_path: Path
) -> None:
    log = tmp_path / "tools.log"
    pings = ("--supervision.ping-interval-s", "0.5", "--supervision.ping-timeout-s", "1")
    with tool_server(
        corpus_file, log, "--workers", "2", *pings, "--supervision.missed-pings", "2"
    ) as (server):
        assert server.process is not None
        supervisor = server.process.pid
        victim, survivor = worker_pid(log, 0), worker_pid(log, 1)
        os.kill(victim, signal.SIGSTOP)
        wait_for(
            lambda: replaced(supervisor, victim, survivor),
            timeout_s=60,
            what="the frozen one replaced",
        )
        assert httpx.get(f"{server.urls[0]}/health", timeout=60).json() == {"status": "ok"}
        assert not running(victim)
    text = log.read_text()
    assert "worker_frozen worker=0" in text
    assert "worker_frozen worker=1" not in text  # the one that kept answering was left alone
    assert 'reason="did not answer /health 2 times in a row (1 s each)"' in text


def test_a_call_in_flight_to_a_frozen_worker_is_answered_session_lost_by_its_replacement(
    corpus_file: Path, tmp_path: Path
) -> None:
    """Issue 27: with the default pings (found 8 s after the last answer) a click already sent
    to a worker that froze is answered before its client's 30 s deadline: the supervisor kills
    the worker, the rollout's client retries on the port that never stopped listening, and the
    replacement answers `session_lost` (search again). With 3 missed pings of 10 s the worker
    was found after ~42 s, and the click timed out as a tool-server failure."""
    log = tmp_path / "tools.log"

    async def episode(url: str, victim: int) -> ToolReply:
        settings = RolloutSettings(  # the client timeout the issue measured
            sglang_url="http://127.0.0.1:9",
            tool_server_url=((url,),),
            reward_server_url=("http://127.0.0.1:9",),
            tool_timeout_s=30.0,
        )
        try:
            search = ToolCall("search", {"query": "orrery"})
            first = await call_tool(settings, url, "frozen", search, ())
            assert first.error is None, first
            os.kill(victim, signal.SIGSTOP)  # its pooled connection now goes unanswered
            return await call_tool(settings, url, "frozen", ToolCall("click", {"link_id": 1}), ())
        finally:
            await close_clients()

    with tool_server(corpus_file, log, "--workers", "2") as server:
        assert server.process is not None
        victim = worker_pid(log, 0)
        reply = asyncio.run(episode(server.urls[0], victim))
        assert reply.error is not None and reply.error.code == "session_lost", reply
        assert "search again" in reply.observation
        assert not running(victim)
    text = log.read_text()
    assert "worker_frozen worker=0 url=" in text
    assert 'reason="did not answer /health 2 times in a row (3 s each)"' in text


def test_restarts_past_the_bound_end_the_whole_server_with_a_non_zero_status(
    corpus_file: Path, tmp_path: Path
) -> None:
    log = tmp_path / "tools.log"
    bound = ("--supervision.max-restarts", "1")
    with tool_server(corpus_file, log, "--workers", "2", *bound) as server:
        assert server.process is not None
        supervisor = server.process.pid
        victim, survivor = worker_pid(log, 0), worker_pid(log, 1)
        os.kill(victim, signal.SIGKILL)
        fresh = wait_for(
            lambda: replaced(supervisor, victim, survivor), timeout_s=60, what="a new worker"
        )
        os.kill(fresh, signal.SIGKILL)  # a second death within the minute: past the bound
        status = server.process.wait(timeout=60)
        assert status == 1  # never a server that restarts forever
        wait_for(lambda: not running(survivor), timeout_s=30, what="the other worker")
    text = log.read_text()
    assert "worker_exited" in text and "status=-9" in text
    assert "exited with status -9, after 1 restarts in the last 60 s (the most allowed: 1)" in text
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.urls[0]}/health", timeout=2)


def test_the_workers_die_with_a_killed_supervisor(corpus_file: Path, tmp_path: Path) -> None:
    with tool_server(corpus_file, tmp_path / "tools.log", "--workers", "2") as server:
        assert server.process is not None
        workers = worker_pids(server.process.pid)
        server.process.kill()  # SIGKILL: no handler runs, PR_SET_PDEATHSIG ends the workers
        server.process.wait(timeout=10)
        wait_for(lambda: not any(running(pid) for pid in workers), timeout_s=30, what="the workers")


def test_one_worker_is_one_process_as_before(corpus_file: Path, tmp_path: Path) -> None:
    with tool_server(corpus_file, tmp_path / "tools.log", "--workers", "1") as server:
        assert server.process is not None and len(server.urls) == 1
        assert worker_pids(server.process.pid) == []
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    assert "workers, a process each" not in (tmp_path / "tools.log").read_text()


def test_a_bad_worker_count_is_refused_before_anything_starts(corpus_file: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services", "tools", "--workers", "0", "--corpus", str(corpus_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--workers: expected a whole number >= 1, got 0" in result.stderr


def test_the_default_is_one_worker_per_core_of_the_affinity_capped() -> None:
    cores = len(os.sched_getaffinity(0))
    assert default_workers() == min(cores, MAX_DEFAULT_WORKERS)
    assert [default_workers(n) for n in (0, 1, 3, 64)] == [1, 1, 3, MAX_DEFAULT_WORKERS]
