"""Services as child processes (services.process): how a local run and every node of a Slurm
job start them, and what a job's signals do to them."""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import pytest

from services.process import ServiceProcess, ServiceStartError
from services.secrets import TOKEN_ENV
from services.waiting import WaitTimeout, wait_for


def reward_server(
    tmp_path: Path, *extra: str, environment: dict[str, str] | None = None
) -> ServiceProcess:
    arguments = ["reward", "--judge", "rule", "--log-level", "WARNING", *extra]
    return ServiceProcess("reward", arguments, tmp_path / "reward.log", environment=environment)


def test_a_service_started_with_the_token_is_seen_ready(tmp_path: Path) -> None:
    """/ready answers only a client with the token: the starter must send it (it waited
    forever before, so a run with DEEPDIVE_SERVICE_TOKEN set never started)."""
    server = reward_server(tmp_path, environment={TOKEN_ENV: "a-token-of-32-characters-or-so-xx"})
    server.ready_timeout_s = 30
    with server:
        assert server.url.startswith("http://127.0.0.1:")


def test_the_scheduler_warning_signals_do_not_end_a_service(tmp_path: Path) -> None:
    """Slurm signals every process of a job with USR2 before a requeue; the bootstrap decides,
    the services must still be there to be stopped in order."""
    with reward_server(tmp_path) as server:
        assert server.process is not None
        for number in (signal.SIGUSR1, signal.SIGUSR2):
            os.kill(server.process.pid, number)
        time.sleep(0.5)
        assert server.alive() and server.failure() is None


def test_a_service_that_cannot_start_says_why(tmp_path: Path) -> None:
    server = reward_server(tmp_path, "--no-such-option")
    with pytest.raises(ServiceStartError) as error:
        server.start()
    assert "exited with status 2" in error.value.message
    assert "--no-such-option" in error.value.message  # the end of its log


def test_waiting_polls_with_backoff_checks_and_stops_at_the_deadline() -> None:
    calls: list[float] = []

    def probe() -> str | None:
        calls.append(time.monotonic())
        return "here" if len(calls) == 4 else None

    assert wait_for(probe, timeout_s=5, what="x") == "here"
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps == sorted(gaps) and gaps[0] < 0.05  # a fast event is seen fast

    def fail() -> None:
        raise RuntimeError("the child died")

    with pytest.raises(RuntimeError, match="the child died"):
        wait_for(lambda: None, timeout_s=5, what="x", check=fail)
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"nothing: still waiting after 0\.3 s"):
        wait_for(lambda: False, timeout_s=0.3, what="nothing")
    assert time.monotonic() - started < 1.0
