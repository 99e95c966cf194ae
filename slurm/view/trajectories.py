"""The episodes a run or an eval left, found and chosen for a person to read: where a folder
keeps them (read by deepdive.trajectory_format), the filters `--where` and the page's box share,
and the per-step statistics the page plots. Reading only: the recording is deepdive's."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from deepdive.protocol import OBSERVATION_CLOSE, OBSERVATION_OPEN, find_tool_calls
from deepdive.run_paths import TRAJECTORIES
from deepdive.trajectory_format import (
    STATUSES,
    EpisodeRecord,
    Status,
    ToolCallRecord,
    TurnRecord,
    bounded,
    read_episodes,
    step_files,
)
from deepdive.trajectory_recorder import EVAL_FOLDER, STATS_FILE
from services.base.errors import ConfigError

RESULTS = "results.jsonl"  # what `deepdive eval` writes (slurm/launch/eval_report.py)
WHERE_KEYS = ("reward", "status", "tool", "text", "step", "checkpoint", "id")


def where_of(episode: EpisodeRecord) -> str:
    """Where an episode comes from, in a few characters: `step 3`, `eval step 3 (held-out)`,
    or the checkpoint a `deepdive eval` served."""
    if episode.checkpoint is not None:
        return episode.checkpoint
    if episode.evaluation:
        return f"eval step {episode.step}" + (f" ({episode.eval_set})" if episode.eval_set else "")
    return f"step {episode.step}"


def section_of(episode: EpisodeRecord) -> str:
    """The plots an episode's step belongs to: training's, one evaluation set's, an eval's."""
    if episode.checkpoint is not None:
        return "deepdive eval"
    if episode.evaluation:
        return f"evaluation ({episode.eval_set})" if episode.eval_set else "evaluation"
    return "training"


def reason_of(episode: EpisodeRecord) -> str | None:
    return episode.judge_reason or episode.error


def searchable(episode: EpisodeRecord) -> str:
    """Everything a `text=` filter looks in, lower-cased."""
    parts = [episode.question, episode.label or "", episode.answer or "", reason_of(episode) or ""]
    for turn in episode.turns:
        parts += [turn.text, turn.observation or ""]
    return "\n".join(parts).lower()


def tools_of(episode: EpisodeRecord) -> dict[str, int]:
    """The episode's calls by tool, as the record counts them (finish, malformed included)."""
    return episode.tool_calls


_OBSERVATION = re.compile(
    re.escape(OBSERVATION_OPEN) + r"(.*?)(?:" + re.escape(OBSERVATION_CLOSE) + r"|\Z)", re.DOTALL
)


def split_turns(trajectory: str) -> tuple[TurnRecord, ...]:
    """A trajectory's text (model text and observations interleaved, as the rollout builds it)
    cut into turns: each model segment with the call parsed from it and the observation after.
    For eval folders written before the recorded format, whose rows keep the text whole."""
    turns: list[TurnRecord] = []
    start = 0
    for match in _OBSERVATION.finditer(trajectory):
        observation = match.group(1).strip("\n")
        turns.append(_turn(trajectory[start : match.start()], observation))
        start = match.end()
    tail = trajectory[start:]
    if tail.strip() or not turns:
        turns.append(_turn(tail, None))
    return tuple(turns)


def _turn(text: str, observation: str | None) -> TurnRecord:
    calls = find_tool_calls(text)
    found = calls[0] if calls else None
    call = found.call if found else None
    return TurnRecord(
        text=text.strip(),
        call=ToolCallRecord(call.name, dict(call.arguments)) if call else None,
        call_error=str(found.error) if found and found.error else None,
        observation=None if observation is None else bounded(observation),
        observation_chars=len(observation or ""),
    )


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _legacy_result(row: dict[str, Any], where: str) -> EpisodeRecord:
    """One row of an eval's results.jsonl from before the recorded format (eval_report's
    old `episode_row`: the trajectory as one text, the status in capitals)."""
    label = row.get("label")
    status = _text(row.get("status")).lower()
    if status not in STATUSES:
        raise ConfigError(f"{where}field 'status': expected one of {STATUSES}, got {status!r}")
    answer = row.get("answer")
    return EpisodeRecord(
        step=0,
        group=0,
        sample=int(_number(row.get("sample"))),
        question=_text(row.get("question")),
        label=_text(label.get("answer") if isinstance(label, dict) else label),
        turns=split_turns(_text(row.get("trajectory"))),
        answer=None if answer is None else _text(answer),
        reward=_number(row.get("reward")),
        status=cast(Status, status),
        error=None if row.get("error") is None else _text(row.get("error")),
        evaluation=True,
        prompt_id=_text(row.get("id")),
        checkpoint=_text(row.get("checkpoint")) or "-",
    )


def read_results(path: Path) -> list[EpisodeRecord]:
    """An eval's results.jsonl: records in the trajectory format (its reader), or rows from
    before it (each line tells which by its `format` field)."""
    import orjson

    lines = path.read_bytes().splitlines()
    first = next((line for line in lines if line.strip()), b"")
    if not first or b'"format"' in first:
        return list(read_episodes(path))
    episodes = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {number}: "
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise ConfigError(f"{where}not JSON ({error})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{where}expected a JSON object, got {type(row).__name__}")
        episodes.append(_legacy_result(row, where))
    return episodes


def load_episodes(folder: Path) -> list[EpisodeRecord]:
    """The episodes under `folder`: a run folder (its recorded steps in trajectories/, its
    evals' results in eval/*/), a trajectories folder, or a `deepdive eval` output folder."""
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder (a run folder or a `deepdive eval` --out)")
    if (folder / RESULTS).is_file():
        return read_results(folder / RESULTS)
    episodes: list[EpisodeRecord] = []
    recorded = folder / TRAJECTORIES if (folder / TRAJECTORIES).is_dir() else folder
    for _, path in step_files(recorded) + step_files(recorded / EVAL_FOLDER):
        episodes += read_episodes(path)
    for results in sorted(folder.glob(f"eval/*/{RESULTS}")):
        episodes += read_results(results)
    if not episodes:
        raise ConfigError(
            f"{folder}: no episodes here (no {TRAJECTORIES}/step-*.jsonl.gz and no {RESULTS}); "
            "give a run folder or a `deepdive eval` output folder"
        )
    return episodes


@dataclass(frozen=True)
class Where:
    """One `key=value` filter: reward=1, status=aborted, tool=open, text=..., step=3,
    checkpoint=..., id=... (the page's filter box takes the same terms)."""

    key: str
    value: str

    @classmethod
    def parse(cls, term: str) -> Where:
        key, sep, value = term.partition("=")
        key = key.strip().lower()
        if not sep or key not in WHERE_KEYS:
            raise ConfigError(
                f"--where {term!r}: expected KEY=VALUE with KEY one of {', '.join(WHERE_KEYS)}"
            )
        if key in ("reward", "step"):
            try:
                float(value)
            except ValueError:
                raise ConfigError(f"--where {term!r}: {key} takes a number") from None
        return cls(key, value.strip())

    def matches(self, episode: EpisodeRecord) -> bool:
        value = self.value.lower()
        if self.key == "reward":
            return episode.reward == float(value)
        if self.key == "step":
            return episode.step == float(value)
        if self.key == "status":
            return episode.status.lower() == value
        if self.key == "tool":
            return bool(tools_of(episode).get(value))
        if self.key == "checkpoint":
            return (episode.checkpoint or "").lower() == value
        if self.key == "id":
            return str(episode.prompt_id).lower() == value
        return value in searchable(episode)


def select(
    episodes: Sequence[EpisodeRecord],
    wheres: Iterable[Where] = (),
    step: int | None = None,
    last: bool = False,
) -> list[EpisodeRecord]:
    """The episodes of one step (`step`, or the newest with `last`) matching every filter."""
    chosen = list(episodes)
    if last and chosen:
        step = max(e.step for e in chosen)
    if step is not None:
        chosen = [e for e in chosen if e.step == step]
    filters = list(wheres)
    return [e for e in chosen if all(w.matches(e) for w in filters)]


@dataclass(frozen=True)
class StepStats:
    """The agent's statistics over one step's (or one checkpoint's) episodes."""

    where: str
    section: str  # training, evaluation (SET), deepdive eval: the plots it is drawn in
    x: str  # its place on the plots' axis: the step, or the eval's checkpoint
    episodes: int
    reward: float
    turns: float
    finished: float  # share COMPLETED
    truncated: float
    aborted: float
    malformed: float  # share of episodes with a call that did not parse
    tool_calls: dict[str, float]  # per episode, by tool


def _groups(
    episodes: Sequence[EpisodeRecord],
) -> Iterator[tuple[str, list[EpisodeRecord]]]:
    """Training steps in order, then evaluations by step, then eval checkpoints in the order
    the eval played them."""
    grouped: dict[str, list[EpisodeRecord]] = {}
    order: dict[str, tuple[int, str, int, int]] = {}
    for episode in episodes:
        where = where_of(episode)
        kind = 2 if episode.checkpoint is not None else 1 if episode.evaluation else 0
        step = episode.step if kind < 2 else 0
        order.setdefault(where, (kind, section_of(episode), step, len(order)))
        grouped.setdefault(where, []).append(episode)
    for where in sorted(grouped, key=order.__getitem__):
        yield where, grouped[where]


def step_stats(episodes: Sequence[EpisodeRecord]) -> list[StepStats]:
    """One row per training step (in order), per evaluation, per eval checkpoint."""
    rows = []
    for where, group in _groups(episodes):
        n = len(group)
        statuses = Counter(e.status.lower() for e in group)
        calls: Counter[str] = Counter()
        for episode in group:
            calls.update(
                {k: v for k, v in tools_of(episode).items() if k not in ("finish", "malformed")}
            )
        rows.append(
            StepStats(
                where=where,
                section=section_of(group[0]),
                x=group[0].checkpoint or str(group[0].step),
                episodes=n,
                reward=sum(e.reward for e in group) / n,
                turns=sum(len(e.turns) for e in group) / n,
                finished=statuses["completed"] / n,
                truncated=statuses["truncated"] / n,
                aborted=statuses["aborted"] / n,
                malformed=sum(1 for e in group if any(t.call_error for t in e.turns)) / n,
                tool_calls={name: count / n for name, count in sorted(calls.items())},
            )
        )
    return rows


def read_stats(folder: Path) -> list[dict[str, Any]]:
    """The agent statistics the recorder kept per step over all of its episodes (RUN/
    trajectories/stats.jsonl: {step, evaluation, NAME: value}), oldest first; none without
    the file. A last line cut by a crash is left out; any other bad line is named."""
    import orjson

    path = (folder / TRAJECTORIES if (folder / TRAJECTORIES).is_dir() else folder) / STATS_FILE
    if not path.is_file():
        return []
    lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            if number == len(lines):  # an append the crash cut short
                break
            raise ConfigError(f"{path}, line {number}: not JSON ({error})") from None
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ConfigError(f"{path}, line {number}: expected an object with a whole 'step'")
        rows.append(row)
    return sorted(rows, key=lambda row: (bool(row.get("evaluation")), row["step"]))
