"""Episodes for the viewer's tests, written by the code that writes them in a real eval
(slurm/eval_report.py's `episode_row` over the rollout's Sample), in the rollout's own syntax."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from deepdive.protocol import format_observation, format_tool_call
from deepdive.sample import LocalSample, SampleStatus
from slurm.eval_report import episode_row

HOSTILE = '</script><script>alert(1)</script> <img src=x onerror=alert(2)> & "quoted"'


def _call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


def trajectories() -> list[tuple[str, str, str, float, SampleStatus, dict[str, int], str]]:
    """(id, question, trajectory, reward, status, tool calls, label) for a small eval."""
    long_page = "Glass harbour, population 4,100. " * 40
    return [
        (
            "q-search-open",
            "Which harbour did the Amber Line sail from?",
            "I should search."
            + _call("search", query="Amber Line harbour")
            + format_observation("[1] Amber Line - the ferry from Glass Harbour")
            + "Open the first."
            + _call("open", url="https://offline.example/amber-line")
            + format_observation(long_page)
            + _call("finish", answer="Glass Harbour"),
            1.0,
            SampleStatus.COMPLETED,
            {"search": 1, "open": 1},
            "Glass Harbour",
        ),
        (
            "q-wrong",
            "Who founded the Copper Archive?",
            _call("search", query="Copper Archive founder")
            + format_observation("No results found.")
            + _call("finish", answer="Nobody"),
            0.0,
            SampleStatus.COMPLETED,
            {"search": 1},
            "Ida Brandt",
        ),
        (
            "q-aborted",
            "When did the Salt Bridge open?",
            "Let me look." + _call("search", query="Salt Bridge opening"),
            0.0,
            SampleStatus.ABORTED,
            {"search": 1},
            "1911",
        ),
        (
            "q-hostile",
            f"What does {HOSTILE} mean?",
            f"{HOSTILE} <tool_call>{{not json</tool_call>",
            0.0,
            SampleStatus.TRUNCATED,
            {},
            "nothing",
        ),
    ]


def write_eval_folder(folder: Path, checkpoints: tuple[str, ...] = ("base", "step_4")) -> Path:
    """An eval output folder (results.jsonl) of each trajectory under each checkpoint."""
    rows = []
    for checkpoint in checkpoints:
        for index, (qid, question, text, reward, status, calls, label) in enumerate(trajectories()):
            row = {
                "id": qid,
                "label": label,
                "input_messages": [{"role": "user", "content": question}],
            }
            sample = LocalSample(
                index=index,
                response=text,
                reward=reward,
                status=status,
                metadata={
                    "deepdive": {"turns": text.count("<tool_call>"), "tool_calls": calls},
                    "reward_details": {"extracted_answer": "Glass Harbour" if reward else None},
                },
            )
            rows.append(episode_row(checkpoint, row, sample, group_size=1))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return folder
