"""Files and folders that appear whole or not at all: written beside their target under a name
nothing reads, flushed to disk, then renamed into place in one step.

A kill or a full disk at any moment leaves the previous version (or nothing), never half of one.
A folder that replaces another is swapped in by renaming the old one aside first, so there is
always one whole version under the target name or beside it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def partial_path(target: Path) -> Path:
    """A fresh name beside `target` (same folder, same suffix, hidden), for writing it."""
    return target.with_name(f".{target.stem}.partial-{uuid.uuid4().hex[:8]}{target.suffix}")


def fsync(path: Path) -> None:
    """`path` (a file or a folder: a rename in it) on disk, not only in the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for child in path.rglob("*"):
            if child.is_file():
                fsync(child)
    fsync(path)


def publish(partial: Path, target: Path, *, replace: bool = True) -> bool:
    """Move a finished `partial` (a file or a folder) to `target` in one rename, after flushing
    it. With replace=False an existing target is kept and `partial` removed (another writer won
    the race); returns whether `partial` became the target."""
    _fsync_tree(partial)
    if target.is_dir() and not target.is_symlink():
        if not replace:
            shutil.rmtree(partial, ignore_errors=True)
            return False
        aside = target.with_name(f".{target.name}.aside-{uuid.uuid4().hex[:8]}")
        target.rename(aside)
        partial.rename(target)
        shutil.rmtree(aside, ignore_errors=True)
    elif not replace:
        try:  # os.replace would overwrite a file, and fails on a folder another writer made
            if target.exists():
                raise FileExistsError(target)
            os.replace(partial, target)
        except OSError:
            remove(partial)
            return False
    else:
        os.replace(partial, target)
    fsync(target.parent)
    return True


def remove(path: Path) -> None:
    """A file or a folder, gone; nothing there is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def atomic_path(target: Path, *, replace: bool = True) -> Iterator[Path]:
    """Yield a path to write `target` at (a file, or a folder the block creates); on success it
    becomes `target` in one rename, on an exception it is removed and `target` is untouched."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(target)
    try:
        yield partial
    except BaseException:
        remove(partial)
        raise
    publish(partial, target, replace=replace)


def atomic_write_bytes(target: Path, data: bytes) -> None:
    with atomic_path(target) as partial:
        partial.write_bytes(data)
