"""`deepdive serve tools --workers N`: a supervisor and N worker processes, each on its own
port, for real (processes, HTTP on loopback): every worker answers, a stop reaches them all,
and a worker that dies takes the whole server down with a non-zero status."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.process import ServiceProcess
from services.serving.workers import MAX_DEFAULT_WORKERS, default_workers
from services.waiting import wait_for
from tests.helpers import worker_pids

pytestmark = pytest.mark.slow


def tool_server(corpus: Path, log: Path, *extra: str, port: int = 0) -> ServiceProcess:
    arguments = ["tools", "--corpus", str(corpus), "--no-index-cache", "--log-level", "INFO"]
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


def test_a_worker_that_dies_ends_the_whole_server_with_a_non_zero_status(
    corpus_file: Path, tmp_path: Path
) -> None:
    log = tmp_path / "tools.log"
    with tool_server(corpus_file, log, "--workers", "2") as server:
        assert server.process is not None and len(server.urls) == 2
        victim, survivor = worker_pids(server.process.pid)
        os.kill(victim, signal.SIGKILL)
        status = server.process.wait(timeout=30)
        assert status == 1  # never a silent half-capacity server
        wait_for(lambda: not running(survivor), timeout_s=5, what="the other worker")
    text = log.read_text()
    assert "worker_exited" in text and "status=-9" in text
    assert "exited with status -9; the other workers were stopped" in text
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
