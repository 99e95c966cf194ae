"""The recorded episode's format: its JSON form round-trips, a step file is whole or absent,
and a bad line is named by file, line and field."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from deepdive.trajectory_format import (
    FORMAT,
    EpisodeRecord,
    ToolCallRecord,
    TurnRecord,
    encode_line,
    read_episodes,
    read_step,
    step_files,
    step_path,
    write_step,
)
from services.base.errors import ConfigError


def record(step: int = 3, sample: int = 0, **changes: object) -> EpisodeRecord:
    fields: dict[str, object] = {
        "step": step,
        "group": 1,
        "sample": sample,
        "question": "Which river?",
        "label": "Seine",
        "turns": (
            TurnRecord(
                "<tool_call>...</tool_call>",
                12,
                ToolCallRecord("search", {"query": "river"}),
                observation="results",
                observation_chars=5000,
                observation_tokens=900,
            ),
            TurnRecord("no call here", 4, call_error="no tool call"),
        ),
        "answer": None,
        "reward": 0.0,
        "status": "failed",
        "error": "malformed: no tool call",
        "response_tokens": 916,
        "prompt_id": "q-1",
    }
    fields.update(changes)
    return EpisodeRecord(**fields)  # type: ignore[arg-type]


def test_a_record_round_trips_through_a_step_file(tmp_path: Path) -> None:
    records = [record(sample=0), record(sample=1, status="completed", reward=1.0)]
    path = write_step(tmp_path, 3, records)
    assert path == step_path(tmp_path, 3) and path.name == "step-00000003.jsonl.gz"
    assert read_step(tmp_path, 3) == records
    assert records[0].tool_calls == {"search": 1, "malformed": 1}


def test_step_files_are_ordered_and_a_partial_file_is_no_step(tmp_path: Path) -> None:
    write_step(tmp_path, 10, [record(10)])
    write_step(tmp_path, 2, [record(2)])
    (tmp_path / ".step-00000011.partial-ab12cd34.jsonl.gz").write_bytes(b"\x1f\x8b half")
    assert [step for step, _ in step_files(tmp_path)] == [2, 10]


def test_a_failed_write_leaves_the_previous_file(tmp_path: Path) -> None:
    write_step(tmp_path, 1, [record(1)])

    def exploding() -> object:
        yield record(1, sample=5)
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_step(tmp_path, 1, exploding())  # type: ignore[arg-type]
    assert read_step(tmp_path, 1) == [record(1)]
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000001.jsonl.gz"]


def test_a_huge_integer_the_model_wrote_is_kept_as_text() -> None:
    turn = TurnRecord("x", call=ToolCallRecord("search", {"query": "q", "num": 10**30}))
    line = encode_line(record(turns=(turn,)))
    assert b'"num":"1000000000000000000000000000000"' in line


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"format": "something"}, "field 'format'"),
        ({"version": 99}, "field 'version'"),
        ({"status": "done"}, "field 'status'"),
        ({"reward": "1"}, "field 'reward'"),
        ({"turns": {}}, "field 'turns'"),
    ],
)
def test_a_bad_line_is_named(tmp_path: Path, change: dict[str, object], named: str) -> None:
    body = {**record().as_json(), **change}
    path = tmp_path / "results.jsonl"
    path.write_bytes(encode_line(record()) + orjson.dumps(body) + b"\n")
    with pytest.raises(ConfigError, match=rf"results.jsonl, line 2: {named}"):
        list(read_episodes(path))


def test_a_truncated_gzip_is_named(tmp_path: Path) -> None:
    path = step_path(tmp_path, 4)
    path.write_bytes(gzip.compress(encode_line(record()))[:20])
    with pytest.raises(ConfigError, match="not a readable trajectory file"):
        list(read_episodes(path))


def test_the_json_names_its_format() -> None:
    assert record().as_json()["format"] == FORMAT
