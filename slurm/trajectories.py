"""The episodes a run or an eval left, as a person reads them: each episode's turns (the model's
text, the call it parsed to, the observation), the filters `--where` and the page's box share,
and the per-step statistics the page plots. Reading only: the recording is deepdive's."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deepdive.protocol import (
    OBSERVATION_CLOSE,
    OBSERVATION_OPEN,
    find_tool_calls,
)
from services.base.errors import ConfigError

RESULTS = "results.jsonl"  # what `deepdive eval` writes (slurm/eval_report.py)
WHERE_KEYS = ("reward", "status", "tool", "text", "step", "checkpoint", "id")


@dataclass(frozen=True)
class Turn:
    """One model turn: what it wrote, the call that parsed from it (or why none did), and the
    observation that came back (kept bounded; `observation_chars` is its full length)."""

    text: str
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    call_error: str | None = None
    observation: str | None = None
    observation_chars: int = 0


@dataclass(frozen=True)
class Episode:
    step: int | None  # the training step; None for an eval's episode
    checkpoint: str | None  # the eval's checkpoint; None for a training episode
    id: str
    sample: int
    question: str
    label: str
    answer: str | None
    reward: float
    status: str  # COMPLETED, TRUNCATED, ABORTED, FAILED
    reason: str | None  # the judge's reason or the rollout's error
    turns: tuple[Turn, ...]
    tool_calls: dict[str, int] = field(default_factory=dict)

    @property
    def where(self) -> str:
        """Where the episode comes from, in a few characters: `step 3` or the checkpoint."""
        return f"step {self.step}" if self.step is not None else (self.checkpoint or "-")

    def searchable(self) -> str:
        """Everything a `text=` filter looks in, lower-cased."""
        parts = [self.question, self.label, self.answer or "", self.reason or ""]
        for turn in self.turns:
            parts += [turn.text, turn.observation or ""]
        return "\n".join(parts).lower()


_OBSERVATION = re.compile(
    re.escape(OBSERVATION_OPEN) + r"(.*?)(?:" + re.escape(OBSERVATION_CLOSE) + r"|\Z)", re.DOTALL
)


def split_turns(trajectory: str) -> tuple[Turn, ...]:
    """A trajectory's text (model text and observations interleaved, as the rollout builds it)
    cut into turns: each model segment with the call parsed from it and the observation after."""
    turns: list[Turn] = []
    start = 0
    for match in _OBSERVATION.finditer(trajectory):
        observation = match.group(1).strip("\n")
        turns.append(_turn(trajectory[start : match.start()], observation))
        start = match.end()
    tail = trajectory[start:]
    if tail.strip() or not turns:
        turns.append(_turn(tail, None))
    return tuple(turns)


def _turn(text: str, observation: str | None) -> Turn:
    calls = find_tool_calls(text)
    call = calls[0] if calls else None
    return Turn(
        text=text.strip(),
        tool=call.call.name if call and call.call else None,
        arguments=dict(call.call.arguments) if call and call.call else None,
        call_error=str(call.error) if call and call.error else None,
        observation=observation,
        observation_chars=len(observation or ""),
    )


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def episode_from_result(row: dict[str, Any]) -> Episode:
    """One row of an eval's results.jsonl (slurm/eval_report.py's `episode_row`)."""
    label = row.get("label")
    if isinstance(label, dict):
        label = label.get("answer")
    calls = row.get("tool_calls")
    return Episode(
        step=None,
        checkpoint=_text(row.get("checkpoint")) or None,
        id=_text(row.get("id")),
        sample=int(_number(row.get("sample"))),
        question=_text(row.get("question")),
        label=_text(label),
        answer=None if row.get("answer") is None else _text(row.get("answer")),
        reward=_number(row.get("reward")),
        status=_text(row.get("status")).upper() or "UNKNOWN",
        reason=None if row.get("error") is None else _text(row.get("error")),
        turns=split_turns(_text(row.get("trajectory"))),
        tool_calls={str(k): int(_number(v)) for k, v in calls.items()}
        if isinstance(calls, dict)
        else {},
    )


def read_results(path: Path) -> list[Episode]:
    """An eval's results.jsonl; a line that is not a JSON object is named (file and line)."""
    import orjson

    episodes = []
    for number, line in enumerate(path.read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            raise ConfigError(f"{path}:{number}: not JSON ({error})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: expected a JSON object per line")
        episodes.append(episode_from_result(row))
    return episodes


def load_episodes(folder: Path) -> list[Episode]:
    """The episodes under `folder`: an eval's output folder (results.jsonl), or a run folder
    (its recorded trajectories; its evals' results beside them)."""
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder (a run folder or a `deepdive eval` --out)")
    if (folder / RESULTS).is_file():
        return read_results(folder / RESULTS)
    episodes: list[Episode] = []
    for results in sorted(folder.glob(f"eval/*/{RESULTS}")):
        episodes += read_results(results)
    if not episodes:
        raise ConfigError(
            f"{folder}: no episodes here (no recorded trajectories and no {RESULTS}); "
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

    def matches(self, episode: Episode) -> bool:
        value = self.value.lower()
        if self.key == "reward":
            return episode.reward == float(value)
        if self.key == "step":
            return episode.step is not None and episode.step == float(value)
        if self.key == "status":
            return episode.status.lower() == value
        if self.key == "tool":
            return any(turn.tool == value for turn in episode.turns) or bool(
                episode.tool_calls.get(value)
            )
        if self.key == "checkpoint":
            return (episode.checkpoint or "").lower() == value
        if self.key == "id":
            return episode.id.lower() == value
        return value in episode.searchable()


def select(
    episodes: Sequence[Episode],
    wheres: Iterable[Where] = (),
    step: int | None = None,
    last: bool = False,
) -> list[Episode]:
    """The episodes of one step (`step`, or the newest with `last`) matching every filter."""
    chosen = list(episodes)
    if last:
        steps = [e.step for e in chosen if e.step is not None]
        if steps:
            step = max(steps)
    if step is not None:
        chosen = [e for e in chosen if e.step == step]
    filters = list(wheres)
    return [e for e in chosen if all(w.matches(e) for w in filters)]


@dataclass(frozen=True)
class StepStats:
    """The agent's statistics over one step's (or one checkpoint's) episodes."""

    where: str
    episodes: int
    reward: float
    turns: float
    finished: float  # share COMPLETED
    truncated: float
    aborted: float
    malformed: float  # share of episodes with a call that did not parse
    tool_calls: dict[str, float]  # per episode, by tool


def _groups(episodes: Sequence[Episode]) -> Iterator[tuple[str, list[Episode]]]:
    grouped: dict[tuple[int, int | str], list[Episode]] = {}
    for episode in episodes:
        key: tuple[int, int | str] = (
            (0, episode.step) if episode.step is not None else (1, episode.checkpoint or "-")
        )
        grouped.setdefault(key, []).append(episode)
    for key in sorted(grouped, key=lambda k: (k[0], str(k[1]).zfill(12))):
        yield grouped[key][0].where, grouped[key]


def step_stats(episodes: Sequence[Episode]) -> list[StepStats]:
    """One row per step (in order), then one per eval checkpoint."""
    rows = []
    for where, group in _groups(episodes):
        n = len(group)
        statuses = Counter(e.status for e in group)
        calls: Counter[str] = Counter()
        for episode in group:
            calls.update(counted_calls(episode))
        rows.append(
            StepStats(
                where=where,
                episodes=n,
                reward=sum(e.reward for e in group) / n,
                turns=sum(len(e.turns) for e in group) / n,
                finished=statuses["COMPLETED"] / n,
                truncated=statuses["TRUNCATED"] / n,
                aborted=statuses["ABORTED"] / n,
                malformed=sum(1 for e in group if any(t.call_error for t in e.turns)) / n,
                tool_calls={name: count / n for name, count in sorted(calls.items())},
            )
        )
    return rows


def counted_calls(episode: Episode) -> dict[str, int]:
    """The episode's tool calls by tool: the recorded counts, else those parsed from its turns."""
    if episode.tool_calls:
        return dict(episode.tool_calls)
    return dict(Counter(turn.tool for turn in episode.turns if turn.tool))
