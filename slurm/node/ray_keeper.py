"""`python -m slurm.node.ray_keeper`: one node's `ray start --block`, and what must happen when it ends
however the job ends: Ray's processes stopped, Ray's session logs (every actor's output) copied
into the attempt folder, Ray's temp dir removed.

The bootstrap could do this itself only while it lives; a bootstrap killed with SIGKILL (or
a job whose KillWait is shorter than Ray's own shutdown) left Ray running ~30 s outside the job
and its temp dir behind forever. The keeper is a child of the bootstrap that shares its fate
(SIGTERM when the bootstrap dies, PR_SET_PDEATHSIG) and does the teardown on any SIGTERM: the
bootstrap's stop, Slurm's cancel or requeue, the bootstrap's death. `ray start` runs in a
process group of its own (never `ray stop --force`, which would end every Ray on the host):
SIGTERM to the group, SIGKILL to what is left after a short grace. Ray's drain on SIGTERM
(RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, 30 s) serves Ray Serve's proxies, which a job has none
of, so the keeper starts Ray with it off.

    python -m slurm.node.ray_keeper --temp-dir T --logs-to DIR [--grace-s S] -- COMMAND...

Its exit code is `ray start`'s when Ray ended by itself (a failure), 0 when it was told to stop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from services.base.process import child_preexec

GRACE_S = 1.0  # SIGTERM to SIGKILL: Ray's processes flush their logs and exit in well under it
COPY_BUDGET_S = 3.0  # the session logs copied within this, the rest listed as not copied
NOT_COPIED = "NOT-COPIED.txt"


class Stop(Exception):
    """A signal asked the keeper to end Ray."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm.node.ray_keeper")
    parser.add_argument("--temp-dir", type=Path, required=True)
    parser.add_argument("--logs-to", type=Path, required=True)
    parser.add_argument("--grace-s", type=float, default=GRACE_S)
    parser.add_argument("--copy-budget-s", type=float, default=COPY_BUDGET_S)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command

    stopping = False

    def on_signal(number: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:  # the first one ends the wait; later ones change nothing
            stopping = True
            raise Stop

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, on_signal)
    code = 0
    ray: subprocess.Popen[bytes] | None = None
    try:
        ray = subprocess.Popen(  # noqa: S603 (ray's own CLI, the bootstrap's arguments)
            command, start_new_session=True, preexec_fn=child_preexec
        )
        code = ray.wait()
    except Stop:
        code = 0
    finally:
        with _signals_held():
            if ray is not None:
                end_group(ray.pid, args.grace_s)
                ray.wait()
            copy_logs(args.temp_dir, args.logs_to, args.copy_budget_s)
            shutil.rmtree(args.temp_dir, ignore_errors=True)
    return code


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """The teardown runs to its end: a second SIGTERM (Slurm signals every process of the step,
    the bootstrap signals us too) must not cut it short."""
    previous = {
        number: signal.signal(number, signal.SIG_IGN)
        for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def end_group(group: int, grace_s: float) -> None:
    """SIGTERM to every process of the group, SIGKILL to any left after `grace_s`."""
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal_group(group, signal.SIGKILL)
    deadline = time.monotonic() + 5.0  # SIGKILL is not refused; a process in D state may lag
    while group_alive(group) and time.monotonic() < deadline:
        time.sleep(0.05)


def copy_logs(temp_dir: Path, destination: Path, budget_s: float) -> None:
    """Every regular file of Ray's newest session's logs folder into `destination`, until the
    budget is spent; what is left is named in NOT-COPIED.txt there."""
    source = temp_dir / "session_latest" / "logs"
    if not source.is_dir():
        return
    deadline = time.monotonic() + budget_s
    skipped: list[str] = []
    for path in sorted(source.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        relative = path.relative_to(source)
        if time.monotonic() > deadline:
            skipped.append(str(relative))
            continue
        target = destination / relative
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        except OSError as error:
            skipped.append(f"{relative}: {error}")
    if skipped:
        lines = [f"not copied within {budget_s:g} s of the job's end:", *skipped]
        (destination / NOT_COPIED).write_text("\n".join(lines) + "\n")


def _signal_group(group: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, number)


def group_alive(group: int) -> bool:
    """Whether any process of the group still runs (zombies do not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == group and state != "Z":
            return True
    return False


if __name__ == "__main__":
    sys.exit(main())
