"""Atomic, resumable checkpoints for the local trainer.

A checkpoint is a folder `step-NNNNNN` holding `state.pt` (model, optimizer, reference, RNG
states, data position, anything the run needs to continue) and `meta.json`. A kill (SIGKILL, a
preempted job) may strike at any instant, so no folder is ever deleted or replaced in place:

- a new checkpoint is written under a temporary name (`step-NNNNNN.tmp-PID`), flushed to disk,
  then renamed in, in one step;
- a folder that goes (an older checkpoint pruned, a step written again, a broken leftover) is
  first renamed aside (`step-NNNNNN.aside-PID-XXXXXXXX`, a name no checkpoint has), and only then
  deleted, so a kill inside the deletion leaves an aside folder, never a half-deleted checkpoint;
- when a step is written again, the old copy goes aside just before the new one is renamed in:
  a kill between the two renames leaves the old copy aside, complete, and `load_latest` falls back
  to it. So once a checkpoint has been written there is always at least one that loads.

`load_latest` tries checkpoints newest first and skips (and logs) any it cannot load. What kills
leave behind is removed by the next save, once its own checkpoint has landed.
"""

from __future__ import annotations

import logging
import os
import random
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

import orjson

from services.base.errors import RuntimeFailure
from services.base.files import fsync
from services.base.logs import log_event

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^step-(\d{6,})$")
# the temporary folder of a save, and a folder renamed aside on its way out
_TEMPORARY = re.compile(r"^step-\d{6,}\.tmp-\d+$")
_ASIDE = re.compile(r"^step-(\d{6,})\.aside-\d+-[0-9a-f]+$")
STATE_FILE = "state.pt"
META_FILE = "meta.json"


class _Unloadable(RuntimeFailure):
    """Why a checkpoint folder cannot be loaded (its message goes to the log)."""


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


def _step(path: Path) -> int | None:
    """The step of a checkpoint folder's name, None for any other name."""
    match = _NAME.match(path.name)
    return int(match.group(1)) if match else None


def _aside_step(path: Path) -> int | None:
    """The step of a folder renamed aside, None for any other name."""
    match = _ASIDE.match(path.name)
    return int(match.group(1)) if match else None


def _is_complete(path: Path) -> bool:
    """Both files are there: a save renames a folder in only once both are written and synced."""
    return (path / STATE_FILE).is_file() and (path / META_FILE).is_file()


def _set_aside(path: Path) -> Path:
    """Rename `path` to a name no checkpoint has, in one step, and return that name."""
    aside = path.with_name(f"{path.name}.aside-{os.getpid()}-{secrets.token_hex(4)}")
    path.rename(aside)
    return aside


def _remove(path: Path) -> None:
    """Delete a folder (or a stray file of the same name) and whatever is in it."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _discard(path: Path) -> None:
    """Delete a folder so that a kill midway never leaves a half-deleted `step-NNNNNN`."""
    if _aside_step(path) is None:
        path = _set_aside(path)
        fsync(path.parent)  # the rename is on disk before any file in it goes
    _remove(path)


def _write_partial(folder: Path, step: int, state: dict[str, Any]) -> Path:
    """Write and sync `state` under a temporary name that never loads as a checkpoint."""
    import torch

    partial = folder / f"step-{step:06d}.tmp-{os.getpid()}"
    partial.mkdir()
    torch.save(state, partial / STATE_FILE)
    (partial / META_FILE).write_bytes(orjson.dumps({"step": step}))
    for name in (STATE_FILE, META_FILE):
        fsync(partial / name)
    fsync(partial)
    return partial


def _land(partial: Path, final: Path) -> None:
    """Rename `partial` in as `final`, setting an existing `final` aside first.

    The old copy stays aside until the save's clean-up: a kill between the two renames leaves it,
    complete, and `load_latest` falls back to it.
    """
    if final.exists():  # the same step written again (a resumed run redoing it)
        _set_aside(final)
    partial.rename(final)
    fsync(final.parent)


def _clean(folder: Path, landed: int, keep: int) -> None:
    """Remove, now that checkpoint `landed` is on disk, what is older and no longer needed.

    That is: aside folders up to `landed` (old copies, pruned or broken folders that a kill left
    half-deleted); checkpoint folders older than `landed` that are incomplete; and complete ones
    beyond the newest `keep`. Newer folders (left by a run that resumed from an older step) stay.
    """
    older: list[tuple[int, Path]] = []
    for path in folder.iterdir():
        step, aside = _step(path), _aside_step(path)
        if aside is not None and aside <= landed:
            _discard(path)
        elif step is not None and step <= landed:
            older.append((step, path))
    complete = 0
    for step, path in sorted(older, reverse=True):
        complete += _is_complete(path)
        if step < landed and (complete > keep or not _is_complete(path)):
            _discard(path)


def save_checkpoint(folder: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write `state` as checkpoint `step` atomically; keep the newest `keep`. Returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    for leftover in folder.iterdir():  # a killed save's temporary folder never loads: free its room
        if _TEMPORARY.match(leftover.name):
            _remove(leftover)
    final = folder / f"step-{step:06d}"
    _land(_write_partial(folder, step, state), final)
    _clean(folder, step, keep)
    return final


def checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary and aside folders never match)."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _step(p) is not None and _is_complete(p)]
    return sorted(found, key=lambda p: _step(p) or 0)


def newest_step(folder: Path) -> int | None:
    """The step of the newest complete checkpoint in `folder`, None when there is none."""
    found = checkpoints(folder)
    return _step(found[-1]) if found else None


def _candidates(folder: Path) -> list[tuple[int, Path]]:
    """Every folder that may hold a checkpoint, newest step first; at one step, the checkpoint
    folder before copies set aside (left there by a kill while that step was written again)."""
    found = []
    for path in folder.iterdir():
        step, aside = _step(path), _aside_step(path)
        if step is not None:
            found.append((step, 1, path))
        elif aside is not None:
            found.append((aside, 0, path))
    return [(step, path) for step, _, path in sorted(found, reverse=True)]


def _read(path: Path, step: int) -> dict[str, Any]:
    """The state saved in `path`; raises _Unloadable, saying why, when it is incomplete or corrupt."""
    import torch

    try:
        meta = orjson.loads((path / META_FILE).read_bytes())
    except FileNotFoundError:
        raise _Unloadable("meta.json missing") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise _Unloadable(f"meta.json unreadable ({type(exc).__name__})") from None
    if not isinstance(meta, dict) or meta.get("step") != step:
        found = meta.get("step") if isinstance(meta, dict) else None
        raise _Unloadable(f"meta.json names step {found}")
    if not (path / STATE_FILE).is_file():
        raise _Unloadable("state.pt missing")
    try:
        # on the CPU: load_state_dict copies onto the model's device, whichever machine wrote it
        state = torch.load(path / STATE_FILE, weights_only=False, map_location="cpu")
    except Exception as exc:  # a cut or corrupt file fails in torch, zipfile or pickle
        raise _Unloadable(f"state.pt unreadable ({type(exc).__name__})") from None
    if not isinstance(state, dict):
        raise _Unloadable(f"state.pt holds a {type(state).__name__}, not a dict")
    return state


def load_checkpoint(path: Path) -> tuple[int, dict[str, Any]]:
    """One checkpoint folder (`step-NNNNNN`) as (step, state); a ValueError saying why it
    cannot be loaded (not a checkpoint, incomplete, corrupt)."""
    step = _step(path)
    if step is None or not path.is_dir():
        raise ValueError(f"{path}: not a checkpoint folder (step-NNNNNN)")
    try:
        return step, _read(path, step)
    except _Unloadable as exc:
        raise ValueError(f"{path}: {exc}") from None


def load_latest(folder: Path) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint that loads, as (step, state); None when none does.

    Each one skipped on the way (incomplete or corrupt: what a kill or a bad disk left) is logged
    at WARNING, so a resume from an older step than expected says why.
    """
    if not folder.is_dir():
        return None
    for step, path in _candidates(folder):
        try:
            return step, _read(path, step)
        except _Unloadable as exc:
            log_event(logger, "checkpoint_skipped", logging.WARNING, folder=path, reason=str(exc))
    return None
