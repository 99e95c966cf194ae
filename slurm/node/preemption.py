"""Node 0 on Slurm's warning: one more save at the next rollout boundary, when the warning
leaves time for it, before the job stops and is requeued.

A requeue resumes from the newest complete checkpoint, so without this it redoes every step
since the last periodic save (up to save_interval - 1 rollouts). Slurm sends the warning
slurm.signal_delay_s before the time limit; the job must then still stop every node and let
the batch script requeue it (the reserve below). The trainer records how long each save took
(deepdive/save_timing.py: the local loop, and slime's train.py through our driver); node 0
forwards the warning to it when the slowest save measured so far fits in what is left (or none
was measured yet: trying costs nothing the time limit would not take anyway), and waits until
a save ends after the warning, the trainer exits, or the time is up. What it decided and what
the requeue loses go into the attempt's end note, which `deepdive status` shows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from deepdive.save_timing import WARNING_SIGNAL, read_save_record
from slurm.node.cadence import LONG_POLL_S

POLL_S = 0.2


class Trainer(Protocol):
    pid: int

    def poll(self) -> int | None: ...


def stop_reserve_s(stop_timeout_s: float) -> float:
    """What the end of the job needs after the warned save: every node stops its children
    (bootstrap.stop_timeout_s, then SIGKILL), node 0 waits for them, and the batch script
    requeues (the same bound as slurm/node/watch.py's NodeWatch.wait_for_peers_to_stop)."""
    return LONG_POLL_S + 2 * stop_timeout_s + 10


@dataclass
class WarnedSave:
    """What node 0 does between the warning and the stop."""

    record: Path  # the trainer's save record (DEEPDIVE_SAVE_TIMING)
    signal_delay_s: float
    stop_timeout_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def run(self, trainer: Trainer | None) -> dict[str, Any]:
        """Forward the warning and wait for the save; the outcome, for the end note."""
        warned_wall = time.time()
        started = self.clock()
        left = self.signal_delay_s - stop_reserve_s(self.stop_timeout_s)
        if trainer is None or trainer.poll() is not None:
            return {"save": "none", "why": "no trainer was running"}
        measured = read_save_record(self.record)
        if measured is not None and measured.max_save_s > left:
            return {
                "save": "skipped",
                "why": (
                    f"a save takes {measured.max_save_s:.1f} s (the slowest measured), the "
                    f"warning leaves {max(left, 0):.1f} s (slurm.signal_delay_s "
                    f"{self.signal_delay_s:g} s less {stop_reserve_s(self.stop_timeout_s):g} s "
                    "to stop and requeue): raise slurm.signal_delay_s"
                ),
            }
        os.kill(trainer.pid, WARNING_SIGNAL)
        deadline = started + max(left, 0)
        while True:
            record = read_save_record(self.record)
            if record is not None and record.t >= warned_wall:
                waited = round(self.clock() - started, 3)
                return {"save": "saved", "saved_step": record.step, "save_s": record.save_s,
                        "waited_s": waited}  # fmt: skip
            code = trainer.poll()
            if code is not None:
                return {"save": "none", "why": f"the trainer exited (status {code})"}
            if self.clock() >= deadline:
                return {
                    "save": "timed out",
                    "why": (
                        f"no save ended within {max(left, 0):.1f} s of the warning (the step "
                        "in progress, or the save, took longer): raise slurm.signal_delay_s"
                    ),
                }
            self.sleep(POLL_S)
