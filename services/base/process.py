"""Start `python -m services ...` (what `deepdive serve` runs) as a child process and wait until
it is ready: how the local run (and each node of a Slurm job) brings up the tool and reward
servers.

The child binds the port it is given (0: a free one) and, once it listens, writes a ready
record (services.base.ready: its URL, or every worker's separated by commas) to the file we
name with --ready-file; we wait for that file, then poll every URL's /ready
(services.base.waiting: backoff, no fixed sleeps). Its log goes to a file (never a pipe that
could fill and stall it), and a child that dies before it is ready is reported with its exit
status and the tail of that log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from services.base.errors import RuntimeFailure
from services.base.files import remove
from services.base.ready import read_ready
from services.base.secrets import TOKEN_ENV
from services.base.waiting import WaitTimeout, wait_for


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


# A batch scheduler warns a job with SIGUSR1/SIGUSR2 before it preempts or times it out
# (submitit asks Slurm for USR2). Slurm signals every process of the job, and both signals end
# a process that does not handle them: the parent decides what a warning means, its children
# must outlive it until they are told to stop.
_WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def child_preexec() -> None:
    """Runs in a child before exec: it gets SIGTERM when we die, even by SIGKILL, so a killed
    run never leaves servers behind (Linux; elsewhere stop() still ends them on a normal exit),
    and it ignores the scheduler's warning signals (an ignored signal stays ignored after exec)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
    for number in _WARNING_SIGNALS:
        signal.signal(number, signal.SIG_IGN)


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a child's log, for an error that says why it died."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def terminate(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM to `process`, SIGKILL if it has not ended after `timeout_s`; returns once it
    has ended (one that ended already is left as it is)."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_process_group(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM to the group `process` leads (started with start_new_session: a server and
    the workers it forked), SIGKILL to the group if it has not ended after `timeout_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def serving_group(
    command: Sequence[str],
    log: Path,
    ready: Callable[[], bool],
    what: str,
    timeout_s: float,
    failure: type[Exception],
) -> Iterator[subprocess.Popen[bytes]]:
    """A server that is not ours (SGLang, its router) as a child in its own process group
    (it forks workers), until `ready()`; `failure(message)` when it exits first or is not
    ready after `timeout_s`; the group stopped when the block ends."""
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603 (the caller's fixed arguments)
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=child_preexec,
        )  # fmt: skip

    def alive() -> None:
        if process.poll() is not None:
            raise failure(
                f"{what} exited with status {process.returncode}; its log ({log}) ends with:\n"
                f"{log_tail(log)}"
            )

    try:
        try:
            wait_for(ready, timeout_s=timeout_s, what=what, check=alive, max_delay_s=2.0)
        except WaitTimeout:
            raise failure(f"{what} was not ready after {timeout_s:g} s ({log})") from None
        yield process
    finally:
        stop_process_group(process)


class ServiceStartError(RuntimeFailure):
    """A service process exited or did not become ready in time."""

    code = "service_start_failed"


class ServiceProcess:
    """One service as a child process: `launch()` starts it, `wait_ready()` blocks until it
    answers /ready (or raises with the tail of its log), `start()` does both."""

    def __init__(
        self,
        name: str,
        arguments: Sequence[str],
        log_path: Path,
        ready_timeout_s: float = 120.0,
        environment: dict[str, str] | None = None,
        port: int = 0,
    ) -> None:
        self.name = name
        self.log_path = log_path
        # beside the log: where the child says it listens (services.base.ready)
        self.ready_path = log_path.with_name(f"{log_path.stem}.ready.json")
        self.command = [
            sys.executable, "-m", "services", *arguments,
            "--port", str(port), "--ready-file", str(self.ready_path),
        ]  # fmt: skip
        self.ready_timeout_s = ready_timeout_s
        self.environment = environment
        self.process: subprocess.Popen[bytes] | None = None
        self.urls: list[str] = []
        self._started = 0.0

    def start(self) -> list[str]:
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        remove(self.ready_path)  # an earlier child's record is not this one's
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(  # noqa: S603 (our own CLI, fixed arguments)
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(self.environment or {})},
                preexec_fn=child_preexec,  # a prctl call and two signal dispositions
            )
        self._started = time.monotonic()

    @property
    def url(self) -> str:
        """The URLs as the announcement shows them to people, joined by commas: `urls` is
        what code hands on."""
        return ",".join(self.urls)

    def wait_ready(self, check: Callable[[], None] | None = None) -> list[str]:
        """Every worker's URL once each answers /ready; `check()` may give up earlier."""

        def checks() -> None:
            self._check_alive()
            if check is not None:
                check()

        remaining = self.ready_timeout_s - (time.monotonic() - self._started)
        try:
            self.urls = wait_for(
                self._ready_urls, timeout_s=remaining, what=self.name, check=checks
            )
            wait_for(self._ready, timeout_s=remaining, what=self.name, check=checks)
        except WaitTimeout:
            self.stop()
            raise ServiceStartError(
                f"the {self.name} server was not ready after {self.ready_timeout_s:.0f} s; "
                f"its log ({self.log_path}) ends with:\n{self._log_tail()}"
            ) from None
        return self.urls

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _ready_urls(self) -> list[str] | None:
        try:
            record = read_ready(self.ready_path)
        except ValueError as error:
            self.stop()
            raise ServiceStartError(
                f"the {self.name} server's ready file ({self.ready_path}) is not a ready "
                f"record: {error}"
            ) from None
        return None if record is None else list(record.urls)

    def _ready(self) -> bool:
        # imported here: Ray's keeper (slurm.node.ray_keeper) imports this module for child_preexec
        # and starts in front of every node's Ray, where httpx's import cost half a second
        import httpx

        # a child started with the service token answers /ready only to a client that has it
        token = {**os.environ, **(self.environment or {})}.get(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        for url in self.urls:
            try:
                response = httpx.get(f"{url}/ready", headers=headers, timeout=5, trust_env=False)
            except httpx.TransportError:
                return False
            if response.status_code != 200:
                return False
        return True

    def _check_alive(self) -> None:
        failure = self.failure()
        if failure is not None:
            raise ServiceStartError(failure)

    def failure(self) -> str | None:
        """Why the service is gone (its exit status and the end of its log), None while it runs."""
        if self.process is None or self.process.poll() is None:
            return None
        return (
            f"the {self.name} server exited with status {self.process.returncode}; "
            f"its log ({self.log_path}) ends with:\n{self._log_tail()}"
        )

    def _log_tail(self) -> str:
        return log_tail(self.log_path)

    def stop(self, timeout_s: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        terminate(process, timeout_s)

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
