"""A trainer's side of the preemption warning: save at the next rollout boundary, and say how
long a save takes.

Slurm warns a job before its time limit or a preemption (sbatch's --signal: SIGURG, whose
default action is to ignore it; slurm/requeue.py says why that signal). Without this a requeue
loses every step since the last periodic checkpoint (up to save_interval - 1 of them). With
it, the trainer (the local backend's loop, or slime's train.py through our driver) saves at the
next rollout boundary once warned, and writes after every save a record of how long the save
took (the path in DEEPDIVE_SAVE_TIMING): node 0's bootstrap reads the record to decide whether
the warning leaves time for one more save, and waits for the warned save before it stops the
job (slurm/node/preemption.py).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import orjson

from services.base.files import atomic_write_bytes

WARNING_SIGNAL = signal.SIGURG  # what Slurm sends (slurm/requeue.py), forwarded by node 0
SAVE_TIMING_ENV = "DEEPDIVE_SAVE_TIMING"


@dataclass(frozen=True)
class SaveRecord:
    """The newest save: its step, how long it took, the slowest save so far, when it ended
    (wall clock, compared across processes)."""

    step: int
    save_s: float
    max_save_s: float
    saves: int
    t: float


def read_save_record(path: Path) -> SaveRecord | None:
    """The record at `path`, None while there is none (or it is not one: a trainer's own
    file, so nothing to refuse, only nothing to go by)."""
    try:
        note = orjson.loads(path.read_bytes())
        return SaveRecord(
            step=int(note["step"]),
            save_s=float(note["save_s"]),
            max_save_s=float(note["max_save_s"]),
            saves=int(note["saves"]),
            t=float(note["t"]),
        )
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


class SaveTimer:
    """Writes the record after each save (nothing without a path: `deepdive run` on a laptop)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        previous = read_save_record(path) if path is not None else None
        # a requeued attempt keeps the slowest save measured before it
        self.max_save_s = previous.max_save_s if previous else 0.0
        self.saves = previous.saves if previous else 0

    @classmethod
    def from_environment(cls) -> SaveTimer:
        where = os.environ.get(SAVE_TIMING_ENV)
        return cls(Path(where) if where else None)

    def saved(self, step: int, seconds: float) -> None:
        self.max_save_s = max(self.max_save_s, seconds)
        self.saves += 1
        if self.path is None:
            return
        record = {
            "step": step,
            "save_s": round(seconds, 3),
            "max_save_s": round(self.max_save_s, 3),
            "saves": self.saves,
            "t": time.time(),
        }
        atomic_write_bytes(self.path, orjson.dumps(record) + b"\n")


class WarningFlag:
    """Set by the warning signal; the trainer reads it at each rollout boundary. Once warned
    the trainer saves at every boundary (the job is ending: node 0 stops it after the first)."""

    def __init__(self) -> None:
        self.warned_at: float | None = None

    def install(self) -> WarningFlag:
        signal.signal(WARNING_SIGNAL, self._on_warning)
        return self

    def _on_warning(self, number: int, frame: FrameType | None) -> None:
        if self.warned_at is None:
            self.warned_at = time.time()

    @property
    def warned(self) -> bool:
        return self.warned_at is not None
