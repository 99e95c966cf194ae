"""Services as child processes (services.base.process): how a local run and every node of a Slurm
job start them, and what a job's signals do to them."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from services.base.process import ServiceProcess, ServiceStartError, serving_group
from services.base.ready import ReadyRecord, read_ready, write_ready
from services.base.secrets import TOKEN_ENV
from services.base.waiting import WaitTimeout, wait_for
from slurm.node.ray_keeper import group_alive  # zombies do not count: a container may not reap them
from tests.helpers import FakeClock


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


def test_the_starter_takes_the_url_from_the_ready_file_the_child_wrote(tmp_path: Path) -> None:
    """The child names where it listens in a typed record beside its log (url, pid, host,
    port), and that is the URL the starter hands on; an earlier child's record there is not
    read as this one's."""
    path = tmp_path / "reward.ready.json"
    write_ready(path, ReadyRecord(("http://127.0.0.1:9",), pid=1, host="127.0.0.1", port=9))
    with reward_server(tmp_path) as server:
        record = read_ready(path)
        assert record is not None and server.process is not None
        assert server.urls == list(record.urls) == [f"http://127.0.0.1:{record.port}"]
        assert (record.pid, record.host) == (server.process.pid, "127.0.0.1")


def test_a_child_that_dies_before_it_is_ready_is_named_with_its_exit_status(
    tmp_path: Path,
) -> None:
    """Exposed beyond loopback without a token, the reward server refuses to start (a
    ConfigError, exit status 2) before it listens: no ready file, and the starter says so at
    once rather than at its deadline."""
    server = reward_server(tmp_path, "--host", "0.0.0.0")
    with pytest.raises(ServiceStartError) as error:
        server.start()
    assert error.value.message.startswith("the reward server exited with status 2;")
    assert "--allow-unauthenticated" in error.value.message  # the end of its log
    assert not (tmp_path / "reward.ready.json").exists()


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


def test_waiting_backs_off_from_10_ms_by_half_each_round() -> None:
    """A fast event is seen fast (the first pause is 10 ms), then each pause is 1.5 times the
    one before: on a clock the test owns, so the pauses are exact, not timed."""
    clock = FakeClock()
    rounds: list[float] = []

    def probe() -> str | None:
        rounds.append(clock())
        return "here" if len(rounds) == 4 else None

    assert wait_for(probe, timeout_s=5, what="x", clock=clock) == "here"
    assert clock.sleeps == pytest.approx([0.01, 0.015, 0.0225])
    assert rounds == pytest.approx([1000.0, 1000.01, 1000.025, 1000.0475])


def test_waiting_stops_at_the_deadline_after_pauses_of_at_most_a_quarter_second() -> None:
    clock = FakeClock()
    with pytest.raises(WaitTimeout, match=r"^nothing: still waiting after 2 s$"):
        wait_for(lambda: False, timeout_s=2, what="nothing", clock=clock)
    assert clock.now == pytest.approx(1002.0)  # not a pause past the deadline
    assert max(clock.sleeps) == 0.25 and clock.sleeps.count(0.25) > 4  # the cap, then held
    assert clock.sleeps[-1] < 0.25  # the last pause: what was left of the deadline


def test_waiting_gives_up_at_once_when_the_check_says_so() -> None:
    def fail() -> None:
        raise RuntimeError("the child died")

    clock = FakeClock()
    with pytest.raises(RuntimeError, match="the child died"):
        wait_for(lambda: None, timeout_s=5, what="x", check=fail, clock=clock)
    assert clock.sleeps == []


class NotServing(Exception):
    pass


def test_a_server_that_is_not_ours_is_served_as_a_group_and_its_failures_are_named(
    tmp_path: Path,
) -> None:
    """serving_group (SGLang for eval, SGLang and its router in the smoke kit): ready when the
    caller's probe says so, the whole process group stopped after; a server that exits first
    or never gets ready raises the caller's error with what it printed."""
    log = tmp_path / "server.log"
    # a server that forks a worker, as SGLang does: the group goes, the worker with it
    forking = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(300)']); print('up', flush=True); time.sleep(300)"
    )
    with serving_group(
        [sys.executable, "-c", forking], log, lambda: "up" in log.read_text(), "fake", 60,
        NotServing,
    ) as process:  # fmt: skip
        group = process.pid
    assert process.poll() is not None
    wait_for(lambda: not group_alive(group), timeout_s=30, what="the worker stopped")
    crashing = [sys.executable, "-c", "print('no GPU here'); raise SystemExit(3)"]
    crashed = r"^fake exited with status 3; its log \(.*server.log\) ends with:\nno GPU here"
    with (
        pytest.raises(NotServing, match=crashed),
        serving_group(crashing, log, lambda: False, "fake", 60, NotServing),
    ):
        pass
    sleeping = [sys.executable, "-c", "import time; time.sleep(300)"]
    with (
        pytest.raises(NotServing, match=r"^fake was not ready after 0.5 s"),
        serving_group(sleeping, log, lambda: False, "fake", 0.5, NotServing),
    ):
        pass
