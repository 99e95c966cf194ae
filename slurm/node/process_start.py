"""When this process started, on the wall clock: the moment Slurm's task began on this node,
before the interpreter loaded anything. A node's first phase line comes only after Python
and the bootstrap's imports; timing a job from there would hide what those imports cost."""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_started_at(pid: int | str = "self") -> float:
    """The process's start as a time.time() value (to the kernel's clock tick, 10 ms).

    /proc/PID/stat's 22nd field is the start in clock ticks after boot (CLOCK_BOOTTIME);
    /proc/stat's btime is whole seconds only, so the boot clock is read here instead."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    ticks = int(stat.rsplit(")", 1)[1].split()[19])  # fields after the command's ")"
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - since_start
