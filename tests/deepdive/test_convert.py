"""`deepdive convert`: golden output, every input format, the bad-input table, atomic writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from deepdive.convert.rows import ConversionError, convert, is_eval, question_id
from deepdive.protocol import SYSTEM_PROMPT, TOOL_SCHEMAS

GOLDEN = Path(__file__).with_name("golden")


def test_golden_output(tmp_path: Path) -> None:
    output = tmp_path / "train.jsonl"
    summary = convert(GOLDEN / "qa_input.jsonl", output)
    assert (summary.read, summary.written, summary.duplicates) == (3, 3, 0)
    expected = GOLDEN / "qa_output.jsonl"
    if os.environ.get("UPDATE_GOLDEN"):
        expected.write_bytes(output.read_bytes())
    assert output.read_text() == expected.read_text()


def test_rows_have_what_slime_and_the_services_need(tmp_path: Path) -> None:
    output = tmp_path / "train.jsonl"
    convert(GOLDEN / "qa_input.jsonl", output)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    first = rows[0]
    assert first["id"] == "haldor-1" and first["source"] == "deepdive"
    assert first["input_messages"] == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": "Which reclusive clockmaker built the silver orrery of Haldor?",
        },
    ]
    assert first["label"] == "Ilse Varen"
    assert [t["function"]["name"] for t in first["tools"]] == ["search", "click", "open", "finish"]
    assert first["tools"] == list(TOOL_SCHEMAS)
    assert first["metadata"]["aliases"] == ["I. Varen"]  # the answer itself is not repeated
    assert first["metadata"]["remote_env_info"] == {
        "forbidden_texts": [first["input_messages"][1]["content"]]
    }
    assert rows[1]["id"] == question_id("In which year was the Haldor museum founded?")
    assert rows[1]["label"] == "1889"
    assert (rows[2]["id"], rows[2]["label"], rows[2]["metadata"]["aliases"]) == (
        "17",
        "Orsk",
        ["Orsk City"],
    )


def test_json_and_parquet_inputs_give_the_same_rows(tmp_path: Path) -> None:
    rows = [
        json.loads(line)
        for line in (GOLDEN / "qa_input.jsonl").read_text().splitlines()
        if line.strip()
    ]
    as_json = tmp_path / "qa.json"
    as_json.write_text(json.dumps(rows))
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "question": [r["question"] for r in rows],
            "answer": [str(r["answer"]) for r in rows],
            "id": [None if "id" not in r else str(r["id"]) for r in rows],
        }
    )
    as_parquet = tmp_path / "qa.parquet"
    pq.write_table(table, as_parquet)
    convert(as_json, tmp_path / "a.jsonl")
    convert(as_parquet, tmp_path / "b.jsonl")
    labels = [json.loads(line)["label"] for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert labels == ["Ilse Varen", "1889", "Orsk"]
    ids_json = [json.loads(line)["id"] for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    ids_parquet = [
        json.loads(line)["id"] for line in (tmp_path / "b.jsonl").read_text().splitlines()
    ]
    assert ids_json == ids_parquet


BAD = [
    ("not json", "invalid_json", "line 2: not valid JSON"),
    ('["question"]', "not_an_object", "line 2: expected a JSON object"),
    ('{"answer": "x"}', "missing_question", "line 2, field 'question': missing"),
    ('{"question": "q?"}', "missing_answer", "line 2, field 'answer': missing"),
    ('{"question": "   ", "answer": "x"}', "empty_question", "line 2, field 'question': is empty"),
    ('{"question": "q?", "answer": ""}', "empty_answer", "line 2, field 'answer': is empty"),
    (
        '{"question": 5, "answer": "x"}',
        "invalid_question",
        "line 2, field 'question': expected a string",
    ),
    (
        '{"question": "q?", "answer": ["x"]}',
        "invalid_answer",
        "line 2, field 'answer': expected a string",
    ),
    (
        '{"question": "q?", "answer": "x", "aliases": {"a": 1}}',
        "invalid_aliases",
        "line 2, field 'aliases'",
    ),
    ('{"question": "q?", "answer": "x", "id": [1]}', "invalid_id", "line 2, field 'id'"),
]


@pytest.mark.parametrize(("line", "reason", "message"), BAD, ids=[b[1] for b in BAD])
def test_bad_rows_are_skipped_and_counted(
    tmp_path: Path, line: str, reason: str, message: str
) -> None:
    source = tmp_path / "qa.jsonl"
    source.write_text('{"question": "good?", "answer": "yes"}\n' + line + "\n")
    summary = convert(source, tmp_path / "out.jsonl")
    assert summary.written == 1 and summary.skipped == {reason: 1}
    assert message in summary.first_errors[0] and str(source) in summary.first_errors[0]


@pytest.mark.parametrize(("line", "reason", "message"), BAD, ids=[b[1] for b in BAD])
def test_strict_stops_at_the_first_bad_row_and_writes_nothing(
    tmp_path: Path, line: str, reason: str, message: str
) -> None:
    source = tmp_path / "qa.jsonl"
    source.write_text('{"question": "good?", "answer": "yes"}\n' + line + "\n")
    output = tmp_path / "out.jsonl"
    output.write_text("previous content\n")
    with pytest.raises(ConversionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        convert(source, output, strict=True)
    assert output.read_text() == "previous content\n"  # the old file is untouched
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_duplicates_are_dropped_by_normalised_question(tmp_path: Path) -> None:
    source = tmp_path / "qa.jsonl"
    source.write_text(
        '{"question": "Who?", "answer": "a"}\n{"question": "  who ", "answer": "b"}\n'
    )
    summary = convert(source, tmp_path / "out.jsonl")
    assert (summary.written, summary.duplicates) == (1, 1)


def test_eval_split_is_deterministic_and_disjoint(tmp_path: Path) -> None:
    source = tmp_path / "qa.jsonl"
    source.write_bytes(
        b"".join(
            orjson.dumps({"question": f"Question {i}?", "answer": str(i)}) + b"\n"
            for i in range(400)
        )
    )
    summary = convert(source, tmp_path / "train.jsonl", eval_fraction=0.1)
    train = {json.loads(line)["id"] for line in (tmp_path / "train.jsonl").read_text().splitlines()}
    held_out = {
        json.loads(line)["id"] for line in (tmp_path / "train.eval.jsonl").read_text().splitlines()
    }
    assert summary.written + summary.eval_written == 400 and not train & held_out
    assert 20 <= len(held_out) <= 60
    assert all(is_eval(i, 0.1, 0) for i in held_out)
    convert(source, tmp_path / "again.jsonl", eval_fraction=0.1)
    assert (tmp_path / "again.eval.jsonl").read_text() == (
        tmp_path / "train.eval.jsonl"
    ).read_text()


def run_convert(out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`deepdive convert` on the golden QA rows, as a subprocess."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm.cli",
            "convert",
            "--input",
            str(GOLDEN / "qa_input.jsonl"),
            "--output",
            str(out),
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_command_prints_a_summary_and_the_slime_flags(tmp_path: Path) -> None:
    out = tmp_path / "train.jsonl"
    result = run_convert(out)
    assert result.returncode == 0, result.stderr
    for flag in (
        f"--prompt-data {out}",
        "--input-key input_messages",
        "--label-key label",
        "--tool-key tools",
        "--metadata-key metadata",
        "--apply-chat-template",
    ):
        assert flag in result.stderr
    assert "rows read: 3" in result.stderr


def test_the_command_reports_a_missing_file_in_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm.cli",
            "convert",
            "--input",
            str(tmp_path / "nope.jsonl"),
            "--output",
            str(tmp_path / "o.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        result.returncode == 2
        and "no such file" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_the_compact_system_prompt(tmp_path: Path) -> None:
    from deepdive.protocol import COMPACT_SYSTEM_PROMPT, TOOL_NAMES

    out = tmp_path / "train.jsonl"
    result = run_convert(out, "--system-prompt", "compact")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {row["input_messages"][0]["content"] for row in rows} == {COMPACT_SYSTEM_PROMPT}
    assert all(name in COMPACT_SYSTEM_PROMPT for name in TOOL_NAMES)


@pytest.mark.parametrize(
    ("question", "recorded_id"),
    [
        ("Какой город принимал Всемирную выставку 1889 года?", "q-b22bfff43292ab43"),
        ("Which <b>city</b> hosted the 1889 fair\u200b?", "q-8237c138c7921af1"),
    ],
)
def test_question_ids_do_not_follow_the_leakage_filters_cleaning(
    question: str, recorded_id: str
) -> None:
    # Recorded before the filter learnt to fold look-alikes and strip tags and invisible
    # characters: converted data keeps its ids.
    assert question_id(question) == recorded_id
