"""Atomic files and folders (services/base/files.py): whole or not at all, never half replaced."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.base.files import atomic_path, atomic_write_bytes, publish


def test_a_file_appears_whole_and_a_failed_write_leaves_the_old_one(tmp_path: Path) -> None:
    target = tmp_path / "a" / "rows.jsonl"
    atomic_write_bytes(target, b"one\n")
    with pytest.raises(RuntimeError), atomic_path(target) as partial:
        partial.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"one\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["rows.jsonl"]  # no leftover
    atomic_write_bytes(target, b"two\n")
    assert target.read_bytes() == b"two\n"


def test_a_folder_replaces_another_whole(tmp_path: Path) -> None:
    target = tmp_path / "model"
    for version in ("old", "new"):
        with atomic_path(target) as partial:
            partial.mkdir()
            (partial / "weights").write_text(version)
            (partial / version).write_text("")
    assert sorted(p.name for p in target.iterdir()) == ["new", "weights"]
    assert (target / "weights").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the old one is gone


def test_without_replace_the_first_writer_wins(tmp_path: Path) -> None:
    target = tmp_path / "index"
    for version in ("first", "second"):
        with atomic_path(target, replace=False) as partial:
            partial.mkdir()
            (partial / "v").write_text(version)
    assert (target / "v").read_text() == "first"
    file_target = tmp_path / "f.txt"
    file_target.write_text("kept")
    other = tmp_path / "g.txt"
    other.write_text("new")
    assert publish(other, file_target, replace=False) is False
    assert file_target.read_text() == "kept" and not other.exists()


def test_the_partial_keeps_the_suffix_writers_read(tmp_path: Path) -> None:
    # matplotlib picks the image format from the suffix of the path it is given
    with atomic_path(tmp_path / "plot.png") as partial:
        assert partial.suffix == ".png" and partial.parent == tmp_path
        partial.write_bytes(b"png")
    assert (tmp_path / "plot.png").read_bytes() == b"png"
