"""The recorded episode, one format for training and evaluation: what a person reads to see what
the agent did (docs/trajectories.md).

An `EpisodeRecord` is one episode: its step, group (the prompt) and sample, the question and label,
every turn (`TurnRecord`: the model's text, the tool call it made, the observation it got back,
bounded, with its full length kept, and the tokens), the final answer, the reward, the status
and the judge's reason. Its JSON form carries the format's name and version (`FORMAT`,
`VERSION`), so a reader of a later version can tell an old line from a bad one.

On disk: one file per step, `step-00000012.jsonl.gz` (gzip, one JSON object a line), in a run's
`trajectories/` folder, written whole or not at all (written beside and renamed into place:
services.base.files), so a crash mid-write leaves the previous steps readable and no half
file. `deepdive eval` writes its `results.jsonl` in the same records (plain JSON lines, with the
checkpoint's name in `checkpoint`); `read_episodes` reads both.
"""

from __future__ import annotations

import gzip
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

import orjson

from services.base.errors import ConfigError
from services.base.files import atomic_path

FORMAT = "deepdive.episode"
VERSION = 1
Status = Literal["completed", "truncated", "aborted", "failed"]
STATUSES: tuple[str, ...] = get_args(Status)
# an observation kept in a record is at most this long (its full length is kept beside it)
OBSERVATION_CHARS = 2_000
STEP_SUFFIX = ".jsonl.gz"
_STEP_FILE = re.compile(r"^step-(\d{8,})\.jsonl\.gz$")


@dataclass(frozen=True)
class ToolCallRecord:
    """The tool call a turn made, as the protocol parsed it."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TurnRecord:
    """One model turn and what it got back.

    text                the model's text of the turn
    tokens              the model's tokens of the turn
    call                the parsed tool call (None: no call, or a malformed one)
    call_error          why the turn's call could not be parsed (a malformed call)
    observation         what the model was shown next, at most OBSERVATION_CHARS (None: the
                        episode ended on this turn)
    observation_chars   the observation's full length
    observation_tokens  the observation's tokens
    tool_error          the kind of the tool's failure (deepdive.protocol.TOOL_ERROR_KINDS, or
                        the tool's own code for the model's mistakes), None when it succeeded
    """

    text: str
    tokens: int = 0
    call: ToolCallRecord | None = None
    call_error: str | None = None
    observation: str | None = None
    observation_chars: int = 0
    observation_tokens: int = 0
    tool_error: str | None = None


@dataclass(frozen=True)
class EpisodeRecord:
    """One episode.

    step            the rollout (training) or the checkpoint's step (eval)
    group           the prompt's group in the step (slime's group_index): the samples of
                    one prompt share it
    sample          the sample's index in its group
    question        the question as the model was asked it; label: the expected answer
    turns           every model turn, in order
    answer          the answer the judge read (None: none was read)
    reward          the reward the episode trained on (0.0 for an aborted one)
    status          completed (finish called) / truncated (turn, context or response limit) /
                    aborted (SGLang refused or failed) / failed (a malformed call)
    judge_reason    why the judge gave the reward (its verdict, the format check, the error)
    error           why the episode ended other than by finish (the rollout's words)
    response_tokens the response's tokens (model and observations)
    evaluation      an evaluation episode (not trained on)
    prompt_id       the prompt's dataset row id, where it has one
    checkpoint      the checkpoint evaluated (deepdive eval), else None
    eval_set        the evaluation set (slime's --eval-prompt-data name, the local run's
                    held-out / unseen), else None
    """

    step: int
    group: int
    sample: int
    question: str
    label: str | None
    turns: tuple[TurnRecord, ...]
    answer: str | None
    reward: float
    status: Status
    judge_reason: str | None = None
    error: str | None = None
    response_tokens: int = 0
    evaluation: bool = False
    prompt_id: str | int | None = None
    checkpoint: str | None = None
    eval_set: str | None = None

    @property
    def tool_calls(self) -> dict[str, int]:
        """Calls per tool (finish included; a malformed call is `malformed`)."""
        counts: dict[str, int] = {}
        for turn in self.turns:
            name = turn.call.name if turn.call else ("malformed" if turn.call_error else None)
            if name:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def as_json(self) -> dict[str, Any]:
        """The versioned JSON object of one line."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "step": self.step,
            "group": self.group,
            "sample": self.sample,
            "prompt_id": self.prompt_id,
            "checkpoint": self.checkpoint,
            "evaluation": self.evaluation,
            "eval_set": self.eval_set,
            "question": self.question,
            "label": self.label,
            "status": self.status,
            "reward": self.reward,
            "answer": self.answer,
            "judge_reason": self.judge_reason,
            "error": self.error,
            "response_tokens": self.response_tokens,
            "tool_calls": self.tool_calls,
            "turns": [_turn_json(turn) for turn in self.turns],
        }

    @classmethod
    def from_json(cls, body: Any, where: str = "") -> EpisodeRecord:
        """The record of one line; raises ConfigError naming `where` (file and line) and the
        field for anything but this format at a version this reader knows."""
        fields = _Fields(body, where)
        if body.get("format") != FORMAT:
            raise ConfigError(
                f"{where}field 'format': expected {FORMAT!r}, got {body.get('format')!r}"
            )
        version = body.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
            raise ConfigError(
                f"{where}field 'version': expected 1 to {VERSION} (this reader's), got {version!r}"
            )
        status = fields.text("status")
        if status not in STATUSES:
            raise ConfigError(f"{where}field 'status': expected one of {STATUSES}, got {status!r}")
        turns = body.get("turns")
        if not isinstance(turns, list):
            raise ConfigError(f"{where}field 'turns': expected a list, got {type(turns).__name__}")
        prompt_id = body.get("prompt_id")
        return cls(
            step=fields.whole("step"),
            group=fields.whole("group"),
            sample=fields.whole("sample"),
            question=fields.text("question"),
            label=fields.optional_text("label"),
            turns=tuple(
                _turn_from_json(turn, f"{where}turn {i}: ") for i, turn in enumerate(turns, 1)
            ),
            answer=fields.optional_text("answer"),
            reward=fields.number("reward"),
            status=cast(Status, status),
            judge_reason=fields.optional_text("judge_reason"),
            error=fields.optional_text("error"),
            response_tokens=fields.whole("response_tokens"),
            evaluation=bool(body.get("evaluation", False)),
            prompt_id=prompt_id if isinstance(prompt_id, str | int) else None,
            checkpoint=fields.optional_text("checkpoint"),
            eval_set=fields.optional_text("eval_set"),
        )


def _turn_json(turn: TurnRecord) -> dict[str, Any]:
    return {
        "text": turn.text,
        "tokens": turn.tokens,
        "call": None
        if turn.call is None
        else {"name": turn.call.name, "arguments": turn.call.arguments},
        "call_error": turn.call_error,
        "observation": turn.observation,
        "observation_chars": turn.observation_chars,
        "observation_tokens": turn.observation_tokens,
        "tool_error": turn.tool_error,
    }


def _turn_from_json(body: Any, where: str) -> TurnRecord:
    fields = _Fields(body, where)
    call = body.get("call")
    if call is not None:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ConfigError(
                f"{where}field 'call': expected {{name, arguments}}, got {call!r:.80}"
            )
        arguments = call.get("arguments")
        call = ToolCallRecord(call["name"], arguments if isinstance(arguments, dict) else {})
    return TurnRecord(
        text=fields.text("text"),
        tokens=fields.whole("tokens"),
        call=call,
        call_error=fields.optional_text("call_error"),
        observation=fields.optional_text("observation"),
        observation_chars=fields.whole("observation_chars"),
        observation_tokens=fields.whole("observation_tokens"),
        tool_error=fields.optional_text("tool_error"),
    )


class _Fields:
    """Typed reads of one JSON object's fields, each failure naming where and which field."""

    def __init__(self, body: Any, where: str) -> None:
        if not isinstance(body, dict):
            raise ConfigError(f"{where}expected a JSON object, got {type(body).__name__}")
        self.body: Mapping[str, Any] = body
        self.where = where

    def _bad(self, name: str, expected: str) -> ConfigError:
        return ConfigError(
            f"{self.where}field {name!r}: expected {expected}, got {self.body.get(name)!r:.80}"
        )

    def whole(self, name: str) -> int:
        value = self.body.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(name, "a whole number")
        return value

    def number(self, name: str) -> float:
        value = self.body.get(name)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise self._bad(name, "a finite number")
        return float(value)

    def text(self, name: str) -> str:
        value = self.body.get(name)
        if not isinstance(value, str):
            raise self._bad(name, "text")
        return value

    def optional_text(self, name: str) -> str | None:
        value = self.body.get(name)
        if value is not None and not isinstance(value, str):
            raise self._bad(name, "text or null")
        return value


def bounded(text: str, limit: int = OBSERVATION_CHARS) -> str:
    """`text` cut to `limit` characters (the record keeps the full length beside it)."""
    return text if len(text) <= limit else text[:limit]


def encode_line(record: EpisodeRecord) -> bytes:
    """One record as a JSON line. Never raises for what a model wrote: a value orjson cannot
    encode (an integer past 64 bits, a lone surrogate) is written as its text."""
    body = record.as_json()
    try:
        return orjson.dumps(body) + b"\n"
    except TypeError:
        return orjson.dumps(_encodable(body)) + b"\n"


def _encodable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(key): _encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(item) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return value.encode("utf-8", errors="replace").decode("utf-8")
    return str(value)


def step_path(folder: Path, step: int) -> Path:
    """The file of `step`'s episodes in a trajectories folder."""
    return folder / f"step-{step:08d}{STEP_SUFFIX}"


def write_step(
    folder: Path,
    step: int,
    records: Iterable[EpisodeRecord],
    clean: Callable[[bytes], bytes] | None = None,
) -> Path:
    """Write `step`'s records as one gzip file of JSON lines, whole or not at all (an
    existing file of the step is replaced), each line passed through `clean` (the recorder's
    redaction of secrets); returns its path."""
    target = step_path(folder, step)
    lines = (encode_line(record) for record in records)
    data = b"".join(clean(line) for line in lines) if clean else b"".join(lines)
    with atomic_path(target) as partial:  # mtime=0: the same records make the same bytes
        partial.write_bytes(gzip.compress(data, compresslevel=6, mtime=0))
    return target


def step_files(folder: Path) -> list[tuple[int, Path]]:
    """The step files in a trajectories folder, oldest step first (a partial file is no step)."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _STEP_FILE.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def read_episodes(path: Path) -> Iterator[EpisodeRecord]:
    """Every record of a step file (`.jsonl.gz`) or of `deepdive eval`'s results.jsonl;
    raises ConfigError naming the file, the line and the field of a bad line."""
    try:
        data = (
            gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
        )
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise ConfigError(f"{path}: not a readable trajectory file ({error})") from None
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            body = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise ConfigError(f"{path}, line {number}: not JSON ({error})") from None
        yield EpisodeRecord.from_json(body, f"{path}, line {number}: ")


def read_step(folder: Path, step: int) -> list[EpisodeRecord]:
    """The records of one step of a trajectories folder."""
    return list(read_episodes(step_path(folder, step)))
