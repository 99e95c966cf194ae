"""Checkpoint retention for slime's run folder: keep the newest `slime.checkpoint.keep_last`
complete checkpoints, remove older ones once a newer save has landed.

Megatron writes a checkpoint as `iter_NNNNNNN/` and, when every rank's part is on disk,
`latest_checkpointed_iteration.txt` naming it (megatron/training/checkpointing.py,
`iter_finalize_fn`); slime saves the data source's state beside it as
`rollout/global_dataset_state_dict_N.pt` (slime/rollout/data_source.py:134) and resumes from
the tracker's iteration (`--load`). So a checkpoint is complete when its iteration is at most
the tracker's; a folder above it is a save in progress and is never touched. Never removed:
the tracker's own (what a requeue resumes from), the one this attempt resumed from (its
trainer may still be reading it), and anything the newest `keep_last` include.

Megatron's own `--save-retain-interval` keeps every R-th checkpoint and the newest, so the
disk still grows with the run; this keeps a fixed number. A removal renames the folder out of
Megatron's naming first (`.removing-iter_NNNNNNN`), so nothing that lists checkpoints finds a
half-removed one, and a removal cut short by the job's end is finished by the next.
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from pathlib import Path
from typing import Any

from services.base.logs import log_event
from slurm.backends.slime.memory_estimate import ModelShape

logger = logging.getLogger("deepdive.job")

TRACKER = "latest_checkpointed_iteration.txt"
# bytes per parameter of a torch_dist checkpoint: the bf16 weights and the distributed
# optimizer's fp32 master copy and Adam's m and v (2 + 4 + 4 + 4)
CHECKPOINT_BYTES_PER_PARAMETER = 14
GB = 1e9
ITERATION = re.compile(r"^iter_(\d{7})$")
REMOVING = ".removing-"


def checkpoint_folder(folder: Path, iteration: int) -> Path:
    return folder / f"iter_{iteration:07d}"


def data_state(folder: Path, iteration: int) -> Path:
    return folder / "rollout" / f"global_dataset_state_dict_{iteration}.pt"


def latest_complete(folder: Path) -> int | None:
    """The tracker's iteration (None: no save has landed, or a "release" checkpoint)."""
    try:
        text = (folder / TRACKER).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def iterations(folder: Path) -> list[int]:
    """Every checkpoint folder's iteration, in order (complete or not)."""
    if not folder.is_dir():
        return []
    found = (ITERATION.match(path.name) for path in folder.iterdir() if path.is_dir())
    return sorted(int(match.group(1)) for match in found if match)


def to_remove(folder: Path, keep_last: int, resumed_from: int | None) -> list[int]:
    """The complete checkpoints `prune` would remove now."""
    latest = latest_complete(folder)
    if keep_last < 1 or latest is None:
        return []
    complete = [iteration for iteration in iterations(folder) if iteration <= latest]
    kept = {*complete[-keep_last:], latest}
    if resumed_from is not None:
        kept.add(resumed_from)
    return [iteration for iteration in complete if iteration not in kept]


def prune(folder: Path, keep_last: int, resumed_from: int | None) -> list[int]:
    """Remove the complete checkpoints beyond the newest `keep_last` (and what an earlier
    removal left); the iterations removed."""
    for leftover in folder.glob(f"{REMOVING}*") if folder.is_dir() else []:
        shutil.rmtree(leftover, ignore_errors=True)
    removed = []
    for iteration in to_remove(folder, keep_last, resumed_from):
        path = checkpoint_folder(folder, iteration)
        doomed = folder / f"{REMOVING}{path.name}"
        path.rename(doomed)  # out of Megatron's naming first: never seen half-removed
        data_state(folder, iteration).unlink(missing_ok=True)
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(iteration)
    return removed


class Pruner:
    """Node 0's retention while the trainer runs: `tend()` is called every few seconds; when
    the tracker names a new checkpoint it prunes in a thread of its own (removing hundreds of
    GB on a parallel file system takes minutes, and the node keeps watching its job)."""

    def __init__(self, folder: Path, keep_last: int, resumed_from: int | None) -> None:
        self.folder = folder
        self.keep_last = keep_last
        self.resumed_from = resumed_from
        self.seen = latest_complete(folder)
        self.removed: list[int] = []
        self._thread: threading.Thread | None = None

    def tend(self) -> None:
        if self.keep_last < 1 or (self._thread is not None and self._thread.is_alive()):
            return
        latest = latest_complete(self.folder)
        if latest is None or latest == self.seen:
            return
        self.seen = latest
        self._thread = threading.Thread(target=self._prune, name="checkpoint-retention")
        self._thread.daemon = True
        self._thread.start()

    def wait(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _prune(self) -> None:
        try:
            removed = prune(self.folder, self.keep_last, self.resumed_from)
        except OSError as error:  # a file system that refuses: said, and tried at the next save
            logger.warning("checkpoint retention: %s", error)
            return
        self.removed += removed
        if removed:
            log_event(logger, "retention", removed=removed, kept_newest=self.keep_last)


def checkpoint_bytes(model_config: dict[str, Any]) -> float | None:
    """One checkpoint's size on disk (None for a model the estimate does not cover)."""
    shape = ModelShape.from_config(model_config)
    return None if shape is None else CHECKPOINT_BYTES_PER_PARAMETER * shape.parameters()


def disk_warnings(
    folder: Path, keep_last: int, model_config: dict[str, Any], free_bytes: int
) -> list[str]:
    """The run folder's file system must hold two checkpoints (the newest complete one and
    the next, being written, before the older goes); every one when keep_last = 0."""
    size = checkpoint_bytes(model_config)
    if size is None or free_bytes >= 2 * size:
        return []
    kept = f"slime.checkpoint.keep_last = {keep_last}" if keep_last else "every one is kept"
    return [
        f"{folder}: {free_bytes / GB:.0f} GB free, but two checkpoints need "
        f"{2 * size / GB:.0f} GB ({size / GB:.0f} GB each: {CHECKPOINT_BYTES_PER_PARAMETER} "
        f"bytes x {size / CHECKPOINT_BYTES_PER_PARAMETER / 1e9:.1f} B parameters; {kept}): "
        "a save would fail part-way, or fill the file system for everyone on it"
    ]


def free_bytes(folder: Path) -> int:
    """Free space where `folder` is, or will be (its nearest existing parent)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage("/").free
