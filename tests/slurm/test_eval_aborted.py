"""`deepdive eval` counts ABORTED episodes apart and refuses a checkpoint whose episodes the
engine mostly failed: its accuracy would measure SGLang (a context too long, a crashed engine),
not the checkpoint, as training's max_aborted_share says for a rollout (deepdive.aborts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from deepdive.sample import LocalSample, SampleStatus
from deepdive.trajectory_format import read_episodes
from slurm.launch.eval_report import episode_row, summarize
from slurm.launch.evaluate import too_many_aborted

REFUSED = "sglang: HTTP 400: The input (40001 tokens) is longer than the model's context length"


def played(completed: int, aborted: int) -> list[Any]:
    samples = []
    for index in range(completed + aborted):
        sample = LocalSample(index=index, reward=1.0 if index < completed else 0.0)
        sample.status = SampleStatus.COMPLETED if index < completed else SampleStatus.ABORTED
        if index >= completed:
            sample.metadata = {"deepdive": {"error": REFUSED, "turns": 1}}
        samples.append(sample)
    return samples


def rows_of(samples: list[Any]) -> list[dict[str, Any]]:
    row = {"id": "q", "input_messages": [{"role": "user", "content": "q?"}], "label": "a"}
    return [episode_row("ckpt", row, sample, len(samples)) for sample in samples]


def test_the_summary_counts_aborted_episodes_apart() -> None:
    summary = summarize(rows_of(played(completed=3, aborted=1)), samples=4)
    assert summary["aborted"] == 1
    assert summary["statuses"] == {"COMPLETED": 3, "ABORTED": 1}
    assert summary["accuracy"] == 1.0  # the three answered; 0.75 counted the abort as wrong
    assert summary["accuracy_all_episodes"] == 0.75


def test_a_checkpoint_mostly_aborted_is_refused_with_the_engines_words() -> None:
    refusal = too_many_aborted("iter_0000010_hf", played(completed=1, aborted=3), limit=0.5)
    assert refusal is not None
    assert refusal.startswith("checkpoint iter_0000010_hf: 3 of 4 episodes ABORTED")
    assert "max_aborted_share = 0.5" in refusal and f"[3x] {REFUSED}" in refusal


def test_aborted_episodes_up_to_the_limit_pass() -> None:
    assert too_many_aborted("ckpt", played(completed=2, aborted=2), limit=0.5) is None
    assert too_many_aborted("ckpt", played(completed=0, aborted=4), limit=1.0) is None
    assert too_many_aborted("ckpt", [], limit=0.0) is None


def test_the_rows_are_the_records_training_keeps(tmp_path: Path) -> None:
    """results.jsonl reads with the trajectories' reader (deepdive.trajectory_format)."""
    rows = rows_of(played(completed=1, aborted=1))
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    episodes = list(read_episodes(path))
    assert [e.status for e in episodes] == ["completed", "aborted"]
    assert [e.checkpoint for e in episodes] == ["ckpt", "ckpt"]
    assert episodes[1].error == REFUSED and episodes[0].question == "q?"
    assert all(e.evaluation and e.prompt_id == "q" for e in episodes)
