"""Start `python -m services ...` (what `deepdive serve` runs) as a child process on a free loopback port and wait until it is
ready: how the local run (and a node of a Slurm job) brings up the tool and reward servers.

The child binds port 0 and announces "... listening on http://HOST:PORT"; we read that line,
then poll /ready. Its log goes to a file (never a pipe that could fill and stall it), and a
child that dies before it is ready is reported with the tail of that log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import httpx

from services.exceptions import ServiceError

ANNOUNCEMENT = "listening on "


def _resolve_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _resolve_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Runs in the child before exec: it gets SIGTERM when we die, even by SIGKILL, so a killed
    run never leaves servers behind (Linux; elsewhere stop() still ends them on a normal exit)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class ServiceStartError(ServiceError):
    """A service process exited or did not become ready in time."""

    code = "service_start_failed"


class ServiceProcess:
    def __init__(
        self,
        name: str,
        arguments: Sequence[str],
        log_path: Path,
        ready_timeout_s: float = 120.0,
        environment: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.command = [sys.executable, "-m", "services", *arguments, "--port", "0"]
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.environment = environment
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(  # noqa: S603 (our own CLI, fixed arguments)
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(self.environment or {})},
                preexec_fn=_die_with_parent,  # only a prctl call, resolved before the fork
            )
        deadline = time.monotonic() + self.ready_timeout_s
        while not self.url:
            self._check_alive()
            for line in self.log_path.read_text(errors="replace").splitlines():
                if ANNOUNCEMENT in line:
                    self.url = line.split(ANNOUNCEMENT, 1)[1].split()[0]
            self._check_deadline(deadline)
            time.sleep(0.05)
        while not self._ready():
            self._check_alive()
            self._check_deadline(deadline)
            time.sleep(0.1)
        return self.url

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/ready", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def _check_alive(self) -> None:
        assert self.process is not None
        if self.process.poll() is not None:
            raise ServiceStartError(
                f"the {self.name} server exited with status {self.process.returncode}; "
                f"its log ({self.log_path}) ends with:\n{self._log_tail()}"
            )

    def _check_deadline(self, deadline: float) -> None:
        if time.monotonic() > deadline:
            self.stop()
            raise ServiceStartError(
                f"the {self.name} server was not ready after {self.ready_timeout_s:.0f} s; "
                f"its log ({self.log_path}) ends with:\n{self._log_tail()}"
            )

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> ServiceProcess:
        self.start()
        return self

    def __exit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
