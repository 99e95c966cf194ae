"""One service as several worker processes, each with its own event loop on its own port, under
a supervisor: how the tool server uses every core of a node.

One uvicorn event loop runs on one core, and the tool server's work between upstream calls
(parsing, the leakage filter, formatting, BM25 for the offline search) is Python on that loop.
The supervisor binds every worker's socket first, so `--port 0` still gives each worker a
distinct port that is known before any worker starts, then forks one worker per socket; each
builds its own app after the fork, so workers share nothing that changes (each has its own
caches, sessions and upstream clients). A client must send every call of a session to the same
worker: the rollout picks it from the episode's prompt (deepdive.routing), with no proxy hop.

The supervisor
- stops every worker on SIGTERM or SIGINT, by SIGTERM (a terminal's Ctrl-C has already reached
  them, they are in its process group, and a second SIGINT makes uvicorn cut its graceful
  shutdown short), waits for them, then ends as one server does: by the same signal;
- fails when a worker ends on its own: it stops the others and raises `WorkerExited` (exit
  status 1), because the rollout keeps sending that worker's share of episodes to its URL;
  a server at part capacity would fail them quietly.
Workers die with the supervisor, even when it is killed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType

from services.exceptions import ConfigError, ServiceError
from services.logs import flush_logs, log_event
from services.process import child_preexec
from services.serving.serve import bind, url_host

logger = logging.getLogger("deepdive.workers")

# The default stops here: every worker holds its own caches (their budgets are per worker)
# and its own upstream concurrency bound, and past 8 an upstream's rate limit, not the cores,
# bounds a node's tool calls.
MAX_DEFAULT_WORKERS = 8
STOP_TIMEOUT_S = 20.0  # uvicorn's graceful shutdown takes up to 10 s; then SIGKILL
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

ServeOne = Callable[[int, socket.socket], None]


class WorkerExited(ServiceError):
    """A worker process ended while the server was meant to be serving."""

    code = "worker_exited"


def default_workers(cores: int | None = None) -> int:
    """One worker per core, at most MAX_DEFAULT_WORKERS. `cores` defaults to the CPUs this
    process may run on (its affinity: what Slurm, a cgroup or taskset left it), not the host's."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        cores = cores or os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def check_workers(count: object) -> int:
    """A worker count given on the command line: a whole number, at least 1."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"--workers: expected a whole number >= 1, got {count!r}")
    return count


def bind_workers(host: str, port: int, count: int) -> list[socket.socket]:
    """A bound socket per worker: ports port .. port+count-1, or with port 0 a free one each."""
    sockets: list[socket.socket] = []
    try:
        for index in range(count):
            sockets.append(bind(host, port + index if port else 0))
    except ConfigError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{url_host(host)}:{port}"


def supervise(sockets: Sequence[socket.socket], serve_one: ServeOne, title: str) -> None:
    """Serve with one forked worker per socket (`serve_one(index, sock)` in each) until
    SIGTERM or SIGINT, then end by that signal; raise `WorkerExited` if a worker ends first.
    Call it before any thread starts: a fork copies only the calling thread."""
    supervisor = _Supervisor(sockets, serve_one, title)
    try:
        supervisor.start()  # before the handlers: a worker must never run the supervisor's
        previous = {number: signal.signal(number, supervisor.on_signal) for number in _STOP_SIGNALS}
        try:
            supervisor.wait()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
    finally:
        supervisor.stop_all(kill=True)  # none is left unless this process itself failed
    if supervisor.failure is not None:
        index, status = supervisor.failure
        raise WorkerExited(
            f"{title} worker {index} ({supervisor.urls[index]}) exited with status {status}; "
            "the other workers were stopped, since the episodes routed to it would have failed"
        )
    if supervisor.received:
        flush_logs()
        signal.raise_signal(supervisor.received[0])  # as one uvicorn server ends: by its signal


class _Supervisor:
    def __init__(self, sockets: Sequence[socket.socket], serve_one: ServeOne, title: str) -> None:
        self.sockets = list(sockets)
        self.urls = [socket_url(sock) for sock in sockets]
        context = multiprocessing.get_context("fork")
        self.workers = [
            context.Process(
                target=_worker_main,
                args=(os.getpid(), index, self.sockets, serve_one),
                name=f"{title} worker {index}",
            )
            for index in range(len(self.sockets))
        ]
        self.alive: set[int] = set()
        self.received: list[int] = []
        self.failure: tuple[int, int | None] | None = None

    def start(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()  # a fork copies unwritten buffers: their lines would be written twice
        gc.freeze()  # the corpus and the code, shared by every worker: the collector of one
        # never writes to (and so never copies) their pages; each worker settles its own heap
        for worker in self.workers:
            worker.start()
            assert worker.pid is not None
            self.alive.add(worker.pid)
        for sock in self.sockets:
            sock.close()  # the workers hold them: a dead worker's port stops answering

    def wait(self) -> None:
        """Until every worker has ended: after a stop signal, or after one ended on its own."""
        pending = {worker.sentinel: index for index, worker in enumerate(self.workers)}
        deadline: float | None = None
        while pending:
            if deadline is None and (self.received or self.failure):
                deadline = time.monotonic() + STOP_TIMEOUT_S
            # a bounded wait: a stop asked for by a signal is seen within a second
            for sentinel in multiprocessing.connection.wait(list(pending), timeout=1.0):
                if isinstance(sentinel, int):
                    self._ended(pending.pop(sentinel))
            if deadline is not None and time.monotonic() > deadline:
                self.stop_all(kill=True)

    def _ended(self, index: int) -> None:
        worker = self.workers[index]
        worker.join()
        self.alive.discard(worker.pid or 0)
        if self.received or self.failure is not None:
            return  # stopping: every worker is meant to end now
        self.failure = (index, worker.exitcode)
        log_event(
            logger,
            "worker_exited",
            logging.ERROR,
            worker=index,
            url=self.urls[index],
            status=worker.exitcode,
        )
        self.stop_all()

    def on_signal(self, number: int, frame: FrameType | None) -> None:
        self.received.append(number)
        self.stop_all()

    def stop_all(self, kill: bool = False) -> None:
        for pid in list(self.alive):
            try:
                os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
            except ProcessLookupError:
                self.alive.discard(pid)


def _worker_main(
    parent: int, index: int, sockets: list[socket.socket], serve_one: ServeOne
) -> None:
    """A worker, just forked: die with the supervisor, hold only its own socket, serve."""
    child_preexec()
    if os.getppid() != parent:  # the supervisor died before the line above took effect
        sys.exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # uvicorn installs its own while it serves
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for position, sock in enumerate(sockets):
        if position != index:
            sock.close()
    log_event(logger, "worker_started", worker=index, url=socket_url(sockets[index]))
    try:
        serve_one(index, sockets[index])
    except ServiceError as error:
        print(f"worker {index}: error: {error.message}", file=sys.stderr, flush=True)
        sys.exit(2 if isinstance(error, ConfigError) else 1)
    except KeyboardInterrupt:
        sys.exit(130)
