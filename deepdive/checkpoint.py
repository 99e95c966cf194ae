"""Atomic, resumable checkpoints for the local trainer.

A checkpoint is a folder `step-NNNNNN` holding `state.pt` (model, optimizer, reference, RNG
states, data position, anything the run needs to continue) and `meta.json`. It is written
under a temporary name, flushed to disk, then renamed in one step: a kill at any moment leaves
either the new checkpoint or none, and the previous one stays loadable. Leftover temporary
folders are removed on the next save. Older checkpoints are pruned only after a new one lands.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import orjson

_NAME = re.compile(r"^step-(\d{6,})$")
STATE_FILE = "state.pt"
META_FILE = "meta.json"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def restore_rng(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(folder: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write `state` as checkpoint `step` atomically; keep the newest `keep`. Returns its path."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    for leftover in folder.glob("step-*.tmp-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    final = folder / f"step-{step:06d}"
    partial = folder / f"{final.name}.tmp-{os.getpid()}"
    partial.mkdir()
    torch.save(state, partial / STATE_FILE)
    (partial / META_FILE).write_bytes(orjson.dumps({"step": step}))
    for name in (STATE_FILE, META_FILE):
        _fsync(partial / name)
    _fsync(partial)
    if final.exists():  # the same step written again (a resumed run redoing it)
        shutil.rmtree(final)
    partial.rename(final)
    _fsync(folder)
    for old in checkpoints(folder)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary folders never match)."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name) and (p / META_FILE).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


def load_latest(folder: Path) -> tuple[int, dict[str, Any]] | None:
    """The newest complete checkpoint's step and state, or None when there is none."""
    import torch

    found = checkpoints(folder)
    if not found:
        return None
    latest = found[-1]
    step = int(orjson.loads((latest / META_FILE).read_bytes())["step"])
    # on the CPU: load_state_dict copies onto the model's device, whichever machine wrote it
    state = torch.load(latest / STATE_FILE, weights_only=False, map_location="cpu")
    return step, state
