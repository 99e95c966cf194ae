"""One service as several worker processes, each with its own event loop on its own port, under
a supervisor: how the tool server uses every core of a node.

One uvicorn event loop runs on one core, and the tool server's work between upstream calls
(parsing, the leakage filter, formatting, BM25 for the offline search) is Python on that loop.
The supervisor binds every worker's socket and makes it listen first, so `--port 0` still gives
each worker a distinct port that is known before any worker starts, then forks one worker per
socket; each builds its own app after the fork, so workers share nothing that changes (each has
its own caches, sessions and upstream clients). A client must send every call of a session to
the same worker: the rollout picks it from the episode's prompt (deepdive.routing), with no
proxy hop.

The supervisor
- keeps every listening socket open for the server's whole life, so a worker's port never stops
  listening: while a worker is replaced, its new connections wait in the kernel's queue and the
  replacement answers them;
- restarts a worker that dies (SIGKILL, a crash on one page) on the same socket after a
  backoff, and one that stops answering GET /health (a frozen loop), which it kills first
  (services/serving/supervision.py: the policy). A replacement knows it is one
  (`WorkerSlot.restarts`): its sessions' state died with the old worker, and /metrics counts
  the restarts (`<service>_worker_restarts_total`);
- fails when restarts come too often (more than `max_restarts` in a minute, over all workers):
  it stops the others and raises `WorkerExited` (exit status 1), as it did on any death before
  restarts existed;
- stops every worker on SIGTERM or SIGINT, by SIGTERM (a terminal's Ctrl-C has already reached
  them, they are in its process group, and a second SIGINT makes uvicorn cut its graceful
  shutdown short), waits for them, then ends as one server does: by the same signal.
Workers die with the supervisor, even when it is killed (PR_SET_PDEATHSIG).

The ping is the standard library's `http.client`, one blocking request per ping in a small
thread pool (a thread per worker, reused; one ping in flight per worker), its end waking the
selector through a socket pair. Not the lean client (services/client/plain_http.py): it is
asyncio, and the supervisor would need an event loop in a thread beside its selector loop for
one tiny request a second; not a hand-written one: http.client parses the reply. Deadlines
stay on the supervisor's clock (a ping past its deadline is a miss there and then; its thread
ends by its socket timeout). No worker is forked while a ping's thread runs, so a new worker
never inherits a ping's socket: a restart waits for the pings in flight (milliseconds).
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import logging
import multiprocessing
import os
import selectors
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from types import FrameType

from services.base.clock import SYSTEM_CLOCK, Now
from services.base.errors import ConfigError, DeepDiveError, RuntimeFailure
from services.base.logs import flush_logs, log_event
from services.base.process import child_preexec
from services.serving.serve import BACKLOG, bind, url_host
from services.serving.supervision import Liveness, RestartBudget, SupervisionPolicy

logger = logging.getLogger("deepdive.workers")

# The default stops here: every worker holds its own caches (their budgets are per worker)
# and its own upstream concurrency bound, and past 8 an upstream's rate limit, not the cores,
# bounds a node's tool calls.
MAX_DEFAULT_WORKERS = 8
STOP_TIMEOUT_S = 20.0  # uvicorn's graceful shutdown takes up to 10 s; then SIGKILL
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class WorkerSlot:
    """What a worker is told: its index (its socket, its port) and how many times a worker of
    that index was started again; a replacement (restarts > 0) lost its sessions' state."""

    def __init__(self, index: int, restarts: int = 0, ready_fd: int | None = None) -> None:
        self.index = index
        self.restarts = restarts
        self._ready_fd = ready_fd

    def serving(self) -> None:
        """Tell the supervisor this worker's app is built and it serves from now on: from here,
        a missed ping counts (before, the worker may still be loading)."""
        fd, self._ready_fd = self._ready_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):  # the supervisor is gone: nobody to tell
                os.write(fd, b"1")
            os.close(fd)


ServeOne = Callable[[WorkerSlot, socket.socket], None]


class WorkerExited(RuntimeFailure):
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


def supervise(
    sockets: Sequence[socket.socket],
    serve_one: ServeOne,
    title: str,
    policy: SupervisionPolicy | None = None,
    clock: Now = SYSTEM_CLOCK,
) -> None:
    """Serve with one forked worker per socket (`serve_one(slot, sock)` in each) until
    SIGTERM or SIGINT, then end by that signal; a worker that dies or stops answering is
    started again (`policy`); raise `WorkerExited` when restarts come too often.
    Call it before any thread starts: a fork copies only the calling thread."""
    supervisor = _Supervisor(sockets, serve_one, title, policy or SupervisionPolicy(), clock)
    try:
        supervisor.start()  # before the handlers: a worker must never run the supervisor's
        previous = {number: signal.signal(number, supervisor.on_signal) for number in _STOP_SIGNALS}
        try:
            supervisor.run()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
    finally:
        supervisor.stop_all(kill=True)  # none is left unless this process itself failed
        supervisor.close()
    if supervisor.failure is not None:
        index, reason = supervisor.failure
        window = supervisor.policy.window_s
        raise WorkerExited(
            f"{title} worker {index} ({supervisor.urls[index]}) {reason}, after "
            f"{supervisor.budget.recent()} restarts in the last {window:g} s (the most allowed: "
            f"{supervisor.policy.max_restarts}); the other workers were stopped, since the "
            "episodes routed to it would have failed"
        )
    if supervisor.received:
        flush_logs()
        signal.raise_signal(supervisor.received[0])  # as one uvicorn server ends: by its signal


def ping_health(address: tuple[str, int], timeout_s: float) -> bool:
    """One GET /health on a fresh connection: True only for a 200 read whole in time (a
    refusal, a timeout, another status or a reply that is not HTTP is a miss). Runs in the
    supervisor's ping threads; `timeout_s` bounds each wait on the socket, so a thread given
    up on (its deadline passed on the supervisor's clock) ends by itself soon after."""
    host, port = address
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", "/health", headers={"Connection": "close"})
        response = connection.getresponse()
        response.read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return response.status == 200


@dataclass
class _Ping:
    """A ping whose thread still runs. `counts` turns False once its outcome no longer matters
    (its deadline passed and was counted a miss, its worker ended, the server is stopping); it
    is kept until the thread ends all the same, since no worker is forked while one runs."""

    future: Future[bool]
    deadline: float
    counts: bool = True


def _ping_address(sock: socket.socket) -> tuple[str, int]:
    """Where the supervisor reaches a worker: its own address, loopback for a wildcard bind."""
    host, port = sock.getsockname()[:2]
    wildcard = {"0.0.0.0": "127.0.0.1", "::": "::1"}  # noqa: S104  # the bind, not ours
    return wildcard.get(host, host), port


class _Supervisor:
    def __init__(
        self,
        sockets: Sequence[socket.socket],
        serve_one: ServeOne,
        title: str,
        policy: SupervisionPolicy,
        clock: Now,
    ) -> None:
        self.sockets = list(sockets)
        self.urls = [socket_url(sock) for sock in sockets]
        self.serve_one = serve_one
        self.title = title
        self.policy = policy
        self.clock = clock
        self.budget = RestartBudget(policy, clock)
        self.context = multiprocessing.get_context("fork")
        self.selector = selectors.DefaultSelector()
        count = len(self.sockets)
        self.workers: list[BaseProcess | None] = [None] * count
        self.restarts = [0] * count
        self.liveness: list[Liveness | None] = [None] * count
        self.pings: dict[int, _Ping] = {}  # index -> its ping whose thread still runs
        self.ping_pool = ThreadPoolExecutor(count, thread_name_prefix=f"{title} ping")
        # a finished ping writes a byte here, which wakes the selector to collect it
        self.wake_read, self.wake_write = socket.socketpair()
        self.wake_read.setblocking(False)
        self.wake_write.setblocking(False)
        self.selector.register(self.wake_read, selectors.EVENT_READ, ("pinged", -1))
        self.ready_pipes: dict[int, int] = {}  # index -> the read end its worker writes to
        self.restart_at: dict[int, float] = {}
        self.frozen: dict[int, str] = {}  # index -> why it was killed
        self.received: list[int] = []
        self.failure: tuple[int, str] | None = None
        self._stop_deadline: float | None = None

    @property
    def stopping(self) -> bool:
        return bool(self.received) or self.failure is not None

    def start(self) -> None:
        for sock in self.sockets:
            sock.listen(BACKLOG)  # from now until the server ends: queued while a worker starts
        gc.freeze()  # the corpus and the code, shared by every worker: the collector of one
        # never writes to (and so never copies) their pages; each worker settles its own heap
        for index in range(len(self.sockets)):
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        sys.stdout.flush()
        flush_logs()  # a fork copies unwritten buffers: their lines would be written twice
        ready_read, ready_write = os.pipe()
        self.ready_pipes[index] = ready_read
        inherited = [
            self.selector.fileno(),
            self.wake_read.fileno(),
            self.wake_write.fileno(),
            *self.ready_pipes.values(),
        ]
        slot = WorkerSlot(index, self.restarts[index], ready_write)
        worker = self.context.Process(
            target=_worker_main,
            args=(os.getpid(), slot, self.sockets, self.serve_one, inherited),
            name=f"{self.title} worker {index}",
        )
        try:
            worker.start()
        finally:
            os.close(ready_write)
        self.workers[index] = worker
        self.selector.register(worker.sentinel, selectors.EVENT_READ, ("exit", index))
        self.selector.register(ready_read, selectors.EVENT_READ, ("ready", index))
        self.liveness[index] = Liveness(self.policy, self.clock)

    def run(self) -> None:
        """Until every worker has ended: after a stop signal, or after restarts ran out."""
        while any(worker is not None for worker in self.workers) or (
            self.restart_at and not self.stopping
        ):
            now = self.clock()
            if self.stopping:
                if self._stop_deadline is None:
                    self._stop_deadline = now + STOP_TIMEOUT_S
                    self.restart_at.clear()
                    self._drop_pings()
                elif now > self._stop_deadline:
                    self.stop_all(kill=True)
            else:
                self._restart_due(now)
                self._ping_due(now)
            for key, _ in self.selector.select(self._wait_s(now)):
                if self.selector.get_map().get(key.fileobj) is not key:
                    continue  # dropped by an event handled before it (its worker ended)
                kind, index = key.data
                if kind == "exit":
                    self._ended(index)
                elif kind == "ready":
                    self._ready(index)
                else:
                    self._collect_pings()
            if not self.stopping:
                self._expire_pings()

    def _wait_s(self, now: float) -> float:
        """Until the next thing to do, at most a second (a stop asked for by a signal is seen)."""
        # while a ping runs no restart starts (`_restart_due`), and its end wakes the selector
        moments = [] if self.pings else [*self.restart_at.values()]
        moments += [ping.deadline for ping in self.pings.values() if ping.counts]
        for index, live in enumerate(self.liveness):
            if live is not None and index not in self.pings:
                moments.append(live.next_ping)
        return max(0.0, min([1.0, *(moment - now for moment in moments)]))

    def _ready(self, index: int) -> None:
        """The worker wrote that it serves (or its pipe closed: it died, its sentinel says so)."""
        said = os.read(self.ready_pipes[index], 1)
        self._drop_ready_pipe(index)
        live = self.liveness[index]
        if said and live is not None:
            live.serving()

    def _drop_ready_pipe(self, index: int) -> None:
        fd = self.ready_pipes.pop(index, None)
        if fd is not None:
            self.selector.unregister(fd)
            os.close(fd)

    def _ended(self, index: int) -> None:
        worker = self.workers[index]
        assert worker is not None
        self.selector.unregister(worker.sentinel)
        worker.join()
        self.workers[index] = None
        self.liveness[index] = None
        self._drop_ping(index)
        self._drop_ready_pipe(index)
        if self.stopping:
            return  # every worker is meant to end now
        reason = self.frozen.pop(index, None) or f"exited with status {worker.exitcode}"
        log_event(
            logger,
            "worker_exited",
            logging.ERROR,
            worker=index,
            url=self.urls[index],
            status=worker.exitcode,
            reason=reason,
        )
        if not self.budget.allows_another():
            self.failure = (index, reason)
            self.stop_all()
            return
        delay = self.budget.backoff_s()
        self.budget.record()
        self.restart_at[index] = self.clock() + delay
        log_event(
            logger,
            "worker_restarting",
            logging.WARNING,
            worker=index,
            url=self.urls[index],
            in_s=f"{delay:g}",
            restarts_last_minute=self.budget.recent(),
        )

    def _restart_due(self, now: float) -> None:
        if self.pings:  # a fork now would copy a ping's socket into the new worker: wait for
            return  # its thread to end (milliseconds; a connect and a read of ping_timeout_s
            # each at worst, and a frozen worker's ping has already waited them out when it is
            # killed); no ping starts meanwhile
        for index, due in list(self.restart_at.items()):
            if now >= due:
                del self.restart_at[index]
                self.restarts[index] += 1
                self._spawn(index)
                worker = self.workers[index]
                log_event(
                    logger,
                    "worker_restarted",
                    logging.WARNING,
                    worker=index,
                    url=self.urls[index],
                    pid=worker.pid if worker else None,
                    restarts=self.restarts[index],
                )

    def _ping_due(self, now: float) -> None:
        if any(now >= due for due in self.restart_at.values()):
            return  # a restart waits for the pings in flight to end: start none meanwhile
        for index, live in enumerate(self.liveness):
            if live is None or index in self.pings or not live.due():
                continue
            deadline = live.ping_sent()
            address = _ping_address(self.sockets[index])
            future = self.ping_pool.submit(ping_health, address, self.policy.ping_timeout_s)
            self.pings[index] = _Ping(future, deadline)
            future.add_done_callback(self._wake)

    def _wake(self, future: Future[bool]) -> None:
        """In the ping's thread: wake the selector (a full buffer is already a wake-up; after
        `close` the socket refuses, and nobody is waiting)."""
        with contextlib.suppress(OSError):
            self.wake_write.send(b"\0")

    def _collect_pings(self) -> None:
        with contextlib.suppress(OSError):
            while self.wake_read.recv(4096):
                pass
        for index, ping in list(self.pings.items()):
            if ping.future.done():
                del self.pings[index]
                if ping.counts and not self.stopping:  # an error ping_health let through: a miss
                    failed = ping.future.exception() is not None
                    self._pinged(index, answered=not failed and ping.future.result())

    def _expire_pings(self) -> None:
        now = self.clock()
        for index, ping in self.pings.items():
            if ping.counts and now >= ping.deadline:
                ping.counts = False
                self._pinged(index, answered=False)

    def _pinged(self, index: int, answered: bool) -> None:
        live = self.liveness[index]
        if live is None:
            return
        live.pinged(answered)
        reason = live.frozen()
        worker = self.workers[index]
        if reason is None or worker is None or worker.pid is None or index in self.frozen:
            return
        self.frozen[index] = reason
        log_event(
            logger,
            "worker_frozen",
            logging.ERROR,
            worker=index,
            url=self.urls[index],
            reason=reason,
        )
        _kill(worker.pid, signal.SIGKILL)  # its sentinel then restarts it as any death

    def _drop_ping(self, index: int) -> None:
        ping = self.pings.get(index)
        if ping is not None:
            ping.counts = False  # its thread ends within ping_timeout_s; its outcome is ignored

    def _drop_pings(self) -> None:
        for index in self.pings:
            self._drop_ping(index)

    def on_signal(self, number: int, frame: FrameType | None) -> None:
        self.received.append(number)
        self.stop_all()

    def stop_all(self, kill: bool = False) -> None:
        for worker in self.workers:
            if worker is not None and worker.pid is not None:
                _kill(worker.pid, signal.SIGKILL if kill else signal.SIGTERM)

    def close(self) -> None:
        self._drop_pings()
        self.ping_pool.shutdown(wait=False, cancel_futures=True)  # a ping in flight ends by
        # its socket timeout; the process's exit waits for it (at most ping_timeout_s)
        self.selector.unregister(self.wake_read)
        self.wake_read.close()
        self.wake_write.close()
        for index in list(self.ready_pipes):
            self._drop_ready_pipe(index)
        self.selector.close()
        for sock in self.sockets:
            sock.close()


def _kill(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


def _worker_main(
    parent: int,
    slot: WorkerSlot,
    sockets: list[socket.socket],
    serve_one: ServeOne,
    inherited: list[int],
) -> None:
    """A worker, just forked: die with the supervisor, hold only its own socket, serve."""
    child_preexec()
    if os.getppid() != parent:  # the supervisor died before the line above took effect
        sys.exit(1)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # uvicorn installs its own while it serves
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for position, sock in enumerate(sockets):
        if position != slot.index:
            sock.close()
    for fd in inherited:  # the supervisor's selector and pings: not this process's business
        with contextlib.suppress(OSError):
            os.close(fd)
    sock = sockets[slot.index]
    log_event(
        logger,
        "worker_started",
        worker=slot.index,
        url=socket_url(sock),
        pid=os.getpid(),
        restarts=slot.restarts,
    )
    try:
        serve_one(slot, sock)
    except DeepDiveError as error:
        print(f"worker {slot.index}: error: {error.message}", file=sys.stderr, flush=True)
        sys.exit(2 if isinstance(error, ConfigError) else 1)
    except KeyboardInterrupt:
        sys.exit(130)
