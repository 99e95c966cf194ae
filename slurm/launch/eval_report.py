"""What `deepdive eval` writes: one row per episode (results.jsonl, in the records training
keeps: deepdive.trajectory_format) and, per checkpoint, the summary a comparison needs
(summary.json, and a table on the console)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace
from typing import Any

from rich.console import Console
from rich.table import Table

from deepdive.eval_metrics import answered_accuracy
from deepdive.trajectory_recorder import episode_record, snapshot


def episode_row(
    checkpoint: str, row: dict[str, Any], sample: Any, group_size: int
) -> dict[str, Any]:
    """One episode, as training records them (deepdive.trajectory_format: `read_episodes`
    reads results.jsonl), with the checkpoint's name, the row's `id` and the whole
    `trajectory` beside: the question, every turn, the answer the judge read, the reward."""
    messages = row.get("input_messages") or []
    question = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
    item = snapshot(sample, (sample.index or 0) % group_size)
    if not isinstance(item.forbidden, list | tuple) or not item.forbidden:
        item = replace(item, forbidden=[str(question or "")])
    if item.label is None:
        item = replace(item, label=row.get("label"))
    if item.prompt_id is None:
        item = replace(item, prompt_id=row.get("id"))
    if item.group < 0:
        item = replace(item, group=(sample.index or 0) // max(1, group_size))
    record = episode_record(item, checkpoint_step(checkpoint), True, checkpoint)
    return {**record.as_json(), "id": row.get("id"), "trajectory": sample.response}


def checkpoint_step(name: str) -> int:
    """The step in a checkpoint's name (iter_0000100, step-000004), 0 when it has none."""
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else 0


def _reason(error: Any) -> str:
    """An error's kind, without the details that make every one different."""
    text = str(error)
    return text.split(":", 1)[0] if ":" in text else text


def summarize(rows: list[dict[str, Any]], samples: int) -> dict[str, Any]:
    """accuracy: the mean reward over the episodes the engine answered (mean pass@1; an ABORTED
    episode is no answer: `aborted` counts them beside it, `accuracy_all_episodes` is the mean
    over every episode); pass@K: questions with at least one rewarded sample; turns and tool
    calls per episode; why episodes did not finish."""
    by_question: dict[Any, list[float]] = {}
    for row in rows:
        by_question.setdefault(row["id"], []).append(row["reward"])
    calls: Counter[str] = Counter()
    for row in rows:
        calls.update(row["tool_calls"])
    statuses = [row["status"].upper() for row in rows]
    count = max(1, len(rows))
    return {
        "questions": len(by_question),
        "episodes": len(rows),
        "samples_per_question": samples,
        "accuracy": answered_accuracy([row["reward"] for row in rows], statuses)[0],
        "accuracy_all_episodes": sum(row["reward"] for row in rows) / count,
        f"pass_at_{samples}": sum(1 for r in by_question.values() if max(r) > 0)
        / max(1, len(by_question)),
        "turns_mean": sum(len(row["turns"]) for row in rows) / count,
        "tool_calls_mean": {name: n / count for name, n in sorted(calls.items())},
        "statuses": dict(Counter(statuses)),
        # SGLang refused or failed these: no answer, left out of the accuracy (deepdive.aborts)
        "aborted": statuses.count("ABORTED"),
        "failure_reasons": dict(
            Counter(_reason(row["error"]) for row in rows if row["error"]).most_common()
        ),
    }


def print_table(summaries: dict[str, dict[str, Any]], samples: int, console: Console) -> None:
    table = Table(title=f"deepdive eval: {samples} sample(s) per question")
    for column in (
        "checkpoint",
        "questions",
        "accuracy",
        f"pass@{samples}",
        "turns",
        "tool calls",
        "aborted",
        "failures",
    ):
        table.add_column(column, justify="left" if column == "checkpoint" else "right")
    for name, summary in summaries.items():
        calls = sum(summary["tool_calls_mean"].values())
        failures = ", ".join(f"{k} {v}" for k, v in list(summary["failure_reasons"].items())[:3])
        table.add_row(
            name,
            str(summary["questions"]),
            f"{summary['accuracy']:.3f}",
            f"{summary[f'pass_at_{samples}']:.3f}",
            f"{summary['turns_mean']:.1f}",
            f"{calls:.1f}",
            str(summary["aborted"]),
            failures or "-",
        )
    console.print(table)
