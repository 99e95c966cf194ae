"""The ready file (services.base.ready): a starter reads a service child's address from a typed
record written whole, never half of one, and never scraped from the log people read."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.base.files import partial_path
from services.base.ready import ReadyRecord, read_ready, write_ready

RECORD = ReadyRecord(
    ("http://127.0.0.1:8700", "http://127.0.0.1:8701"), pid=42, host="127.0.0.1", port=8700
)


def test_a_record_reads_back_as_it_was_written(tmp_path: Path) -> None:
    path = tmp_path / "tools.ready.json"
    assert read_ready(path) is None  # not yet: the starter keeps waiting
    write_ready(path, RECORD)
    assert read_ready(path) == RECORD
    assert [entry.name for entry in tmp_path.iterdir()] == ["tools.ready.json"]  # no partial left


def test_a_record_being_written_is_not_read_as_ready(tmp_path: Path) -> None:
    """The writer fills a hidden partial name and renames it: half a record under that name is
    not the ready file."""
    path = tmp_path / "tools.ready.json"
    partial_path(path).write_bytes(RECORD.to_json()[:20])
    assert read_ready(path) is None


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (RECORD.to_json()[:20], "unexpected end|unexpected character|invalid"),
        (b"[]", "expected a JSON object"),
        (b'{"urls": ["http://x:1"], "pid": 1, "host": "x"}', "port: expected int"),
        (b'{"urls": ["http://x:1"], "pid": true, "host": "x", "port": 1}', "pid: expected int"),
        (b'{"urls": "http://x:1", "pid": 1, "host": "x", "port": 1}', "urls: expected a list"),
        (b'{"urls": [], "pid": 1, "host": "x", "port": 1}', "urls: expected a list"),
    ],
)
def test_a_file_that_is_not_a_whole_record_is_refused(
    tmp_path: Path, data: bytes, why: str
) -> None:
    path = tmp_path / "tools.ready.json"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=why):
        read_ready(path)
