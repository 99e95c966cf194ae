"""DeepDive QA rows -> slime prompt rows.

Input rows carry `question`, `answer`, optional `id` and `aliases`, in JSONL, JSON (a list) or
Parquet. Each output row is what slime's data loader reads (flags from `slime_flags()`):

    {"id", "source", "input_messages": [system, user], "label": answer, "tools": [4 schemas],
     "metadata": {"id", "source", "source_name", "aliases",
                  "remote_env_info": {"forbidden_texts": [question]}}}

The system prompt and the tool schemas come from deepdive.protocol, so the model is told
exactly the protocol the rollout parses and the reward server checks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from deepdive.protocol import SYSTEM_PROMPT, TOOL_SCHEMAS
from services.base.errors import ConfigError
from services.base.files import partial_path, publish, remove
from services.base.text import plain_words

INPUT_KEY = "input_messages"
LABEL_KEY = "label"
TOOL_KEY = "tools"
METADATA_KEY = "metadata"


class ConversionError(ConfigError):
    """The input cannot be converted (unreadable file, or a bad row under --strict)."""


@dataclass(frozen=True)
class RowError:
    """Why one input row was refused: file, line (or row number), field, what was expected."""

    path: Path
    line: int
    field: str | None
    reason: str
    message: str

    def __str__(self) -> str:
        where = f"{self.path}, line {self.line}" + (f", field '{self.field}'" if self.field else "")
        return f"{where}: {self.message}"


@dataclass(frozen=True)
class QARecord:
    line: int
    question: str
    answer: str
    id: str
    aliases: tuple[str, ...] = ()


@dataclass
class ConversionSummary:
    read: int = 0
    written: int = 0
    eval_written: int = 0
    duplicates: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    first_errors: list[str] = field(default_factory=list)

    def record(self, error: RowError) -> None:
        self.skipped[error.reason] += 1
        if len(self.first_errors) < 10:
            self.first_errors.append(str(error))


def read_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(line or row number, parsed row or RowError) for every row of a JSONL, JSON or Parquet file."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise ConversionError(f"{path}: no such file")
    if suffix == ".parquet":
        yield from _parquet_rows(path)
    elif suffix == ".json":
        try:
            data = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as exc:
            raise ConversionError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, list):
            raise ConversionError(
                f"{path}: expected a JSON list of objects, got {type(data).__name__}"
            )
        yield from enumerate(data, start=1)
    else:
        with path.open("rb") as handle:
            for line_number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                try:
                    yield line_number, orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    yield (
                        line_number,
                        RowError(
                            path, line_number, None, "invalid_json", f"not valid JSON ({exc})"
                        ),
                    )


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConversionError(
            f"{path}: reading Parquet needs pyarrow (`pip install 'deepdive-slurm[parquet]'`)"
        ) from None
    number = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            number += 1
            yield number, row


def validate_row(path: Path, line: int, row: Any) -> QARecord | RowError:
    if not isinstance(row, dict):
        return RowError(
            path, line, None, "not_an_object", "expected a JSON object with question and answer"
        )
    values: dict[str, str] = {}
    for name in ("question", "answer"):
        value = row.get(name)
        if value is None:
            return RowError(
                path, line, name, f"missing_{name}", "missing; expected a non-empty string"
            )
        if isinstance(value, int | float) and not isinstance(value, bool) and name == "answer":
            value = str(value)
        if not isinstance(value, str):
            return RowError(
                path,
                line,
                name,
                f"invalid_{name}",
                f"expected a string, got {type(value).__name__}",
            )
        if not value.strip():
            return RowError(path, line, name, f"empty_{name}", "is empty")
        values[name] = " ".join(value.split())
    aliases = row.get("aliases") or []
    if isinstance(aliases, str):
        aliases = [aliases]
    if not isinstance(aliases, list) or not all(isinstance(a, str | int | float) for a in aliases):
        return RowError(path, line, "aliases", "invalid_aliases", "expected a list of strings")
    row_id = row.get("id")
    if row_id is not None and not isinstance(row_id, str | int):
        return RowError(path, line, "id", "invalid_id", "expected a string or an integer")
    stable_id = str(row_id) if row_id is not None else question_id(values["question"])
    clean_aliases = tuple(
        dict.fromkeys(
            str(a).strip() for a in aliases if str(a).strip() and str(a).strip() != values["answer"]
        )
    )
    return QARecord(line, values["question"], values["answer"], stable_id, clean_aliases)


def question_id(question: str) -> str:
    """A stable id from the question's normalised words (same question, same id, any spacing)."""
    return "q-" + hashlib.sha256(" ".join(plain_words(question)).encode()).hexdigest()[:16]


def prompt_row(record: QARecord, source: str, system_prompt: str = SYSTEM_PROMPT) -> dict[str, Any]:
    return {
        "id": record.id,
        "source": source,
        INPUT_KEY: [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": record.question},
        ],
        LABEL_KEY: record.answer,
        TOOL_KEY: list(TOOL_SCHEMAS),
        METADATA_KEY: {
            "id": record.id,
            "source": source,
            "source_name": source,  # slime's per-source metrics read this key (slime/utils/data.py:336)
            "aliases": list(record.aliases),
            "remote_env_info": {"forbidden_texts": [record.question]},
        },
    }


def is_eval(record_id: str, fraction: float, seed: int) -> bool:
    """A deterministic split: the same id lands on the same side in every run."""
    if fraction <= 0:
        return False
    digest = hashlib.sha256(f"{seed}:{record_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def slime_flags(train_path: Path, eval_path: Path | None = None) -> list[str]:
    """The slime arguments that read what `convert` wrote."""
    flags = [
        f"--prompt-data {train_path}",
        f"--input-key {INPUT_KEY}",
        f"--label-key {LABEL_KEY}",
        f"--tool-key {TOOL_KEY}",
        f"--metadata-key {METADATA_KEY}",
        "--apply-chat-template",
    ]
    if eval_path is not None:
        flags.append(f"--eval-prompt-data deepdive_eval {eval_path}")
    return flags


class AtomicJsonlWriter:
    """Rows go to a partial file beside the target, renamed into place only on success.

    As a context manager: committed when the block ends normally, discarded when it raises.
    """

    def __init__(self, target: Path) -> None:
        self.target = target
        target.parent.mkdir(parents=True, exist_ok=True)
        self._partial = partial_path(target)
        self._handle = self._partial.open("xb")

    def write(self, row: dict[str, Any]) -> None:
        self._handle.write(orjson.dumps(row) + b"\n")

    def commit(self) -> None:
        self._handle.close()
        publish(self._partial, self.target)

    def abort(self) -> None:
        self._handle.close()
        remove(self._partial)

    def __enter__(self) -> AtomicJsonlWriter:
        return self

    def __exit__(self, error_type: type[BaseException] | None, *_: object) -> None:
        if error_type is None:
            self.commit()
        else:
            self.abort()


def convert(
    source_path: Path,
    output: Path,
    *,
    source: str = "deepdive",
    eval_fraction: float = 0.0,
    eval_output: Path | None = None,
    strict: bool = False,
    seed: int = 0,
    on_row: Callable[[], None] | None = None,
    system_prompt: str = SYSTEM_PROMPT,
) -> ConversionSummary:
    """Convert `source_path` into `output` (and `eval_output` when splitting). Nothing is written
    unless the whole conversion succeeds."""
    if not 0 <= eval_fraction < 1:
        raise ConversionError(f"--split-eval: expected a fraction in [0, 1), got {eval_fraction}")
    summary = ConversionSummary()
    seen: set[str] = set()
    with contextlib.ExitStack() as stack:  # every file is committed, or none is
        train = stack.enter_context(AtomicJsonlWriter(output))
        held_out = None
        if eval_fraction > 0:
            held_out = stack.enter_context(
                AtomicJsonlWriter(eval_output or default_eval_path(output))
            )
        for line, row in read_rows(source_path):
            summary.read += 1
            if on_row is not None:
                on_row()
            record = row if isinstance(row, RowError) else validate_row(source_path, line, row)
            if isinstance(record, RowError):
                if strict:
                    raise ConversionError(str(record))
                summary.record(record)
                continue
            key = question_id(record.question)
            if key in seen:
                summary.duplicates += 1
                continue
            seen.add(key)
            if held_out is not None and is_eval(record.id, eval_fraction, seed):
                held_out.write(prompt_row(record, source, system_prompt))
                summary.eval_written += 1
            else:
                train.write(prompt_row(record, source, system_prompt))
                summary.written += 1
        if summary.written == 0:
            raise ConversionError(f"{source_path}: no valid rows to write")
    return summary


def default_eval_path(output: Path) -> Path:
    return output.with_name(f"{output.stem}.eval{output.suffix or '.jsonl'}")


def summary_text(summary: ConversionSummary) -> str:
    lines = [
        f"rows read: {summary.read}",
        f"written: {summary.written} train"
        + (f", {summary.eval_written} eval" if summary.eval_written else ""),
        f"duplicates dropped: {summary.duplicates}",
        f"skipped: {sum(summary.skipped.values())}"
        + (f" ({json.dumps(dict(summary.skipped))})" if summary.skipped else ""),
    ]
    lines += [f"  {error}" for error in summary.first_errors]
    return "\n".join(lines)
