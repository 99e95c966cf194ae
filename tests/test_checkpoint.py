"""Atomic checkpoints, the prompt sampler's position, and the metrics log a resume rewinds."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import orjson
import pytest

torch = pytest.importorskip("torch")

from deepdive.checkpoint import (  # noqa: E402
    STATE_FILE,
    checkpoints,
    load_latest,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from deepdive.prompts import PromptSampler  # noqa: E402
from deepdive.run_log import RunLog, plot_rewards  # noqa: E402


def test_save_and_load_round_trip_with_rng(tmp_path: Path) -> None:
    torch.manual_seed(5)
    random.seed(5)
    state = {"weights": torch.arange(4.0), "rng": rng_state(), "position": {"epoch": 1}}
    expected = (torch.rand(3), random.random())
    save_checkpoint(tmp_path, 7, state)
    torch.manual_seed(99)
    step, loaded = load_latest(tmp_path)  # type: ignore[misc]
    assert step == 7 and torch.equal(loaded["weights"], torch.arange(4.0))
    restore_rng(loaded["rng"])
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]


def test_a_kill_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, {"value": 1})
    # What a kill during the next save leaves: its temporary folder, with a truncated state.
    partial = tmp_path / "step-000002.tmp-4242"
    partial.mkdir()
    (partial / STATE_FILE).write_bytes(b"PK\x03\x04 truncated")
    # and a final-looking folder without meta.json (never produced by save, but never trusted)
    (tmp_path / "step-000003").mkdir()
    step, state = load_latest(tmp_path)  # type: ignore[misc]
    assert (step, state) == (1, {"value": 1})
    save_checkpoint(tmp_path, 2, {"value": 2})
    assert not partial.exists()  # the next save clears what the kill left
    assert load_latest(tmp_path) == (2, {"value": 2})


def test_only_the_newest_are_kept(tmp_path: Path) -> None:
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, {"value": step}, keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-000004", "step-000005"]
    assert load_latest(tmp_path / "absent") is None


def test_the_sampler_visits_every_prompt_once_per_epoch_and_resumes() -> None:
    sampler = PromptSampler(10, seed=3)
    first = sampler.take(10)
    assert sorted(first) == list(range(10))
    sampler.take(4)
    saved = sampler.state()
    expected = sampler.take(9)  # crosses into the third epoch
    resumed = PromptSampler(10, seed=3)
    resumed.restore(saved)
    assert resumed.take(9) == expected
    assert PromptSampler(10, seed=4).take(10) != first


def _events(folder: Path) -> list[bytes]:
    """The records of a TensorBoard event file (length, crc, data, crc)."""
    (path,) = folder.glob("events.out.tfevents.*")
    data, records, offset = path.read_bytes(), [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        records.append(data[offset + 12 : offset + 12 + length])
        offset += 12 + length + 4
    return records


def test_the_run_log_writes_jsonl_tensorboard_and_rewinds_on_resume(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    for step in (1, 2, 3):
        log.write(step, {"reward_mean": step / 10, "note": "x"})
    log.close()
    with (tmp_path / "metrics.jsonl").open("ab") as handle:
        handle.write(b'{"step": 4, "rew')  # a line cut by a kill
    resumed = RunLog(tmp_path, resume_after_step=2)
    resumed.write(3, {"reward_mean": 0.9})
    resumed.close()
    assert [(r["step"], r["reward_mean"]) for r in resumed.rows()] == [(1, 0.1), (2, 0.2), (3, 0.9)]
    scalars = b"".join(_events(tmp_path / "tensorboard"))
    assert b"reward_mean" in scalars and b"note" not in scalars
    fresh = RunLog(tmp_path)  # a run that starts over starts the file over
    fresh.close()
    assert fresh.rows() == []


def test_the_reward_plot_is_a_png(tmp_path: Path) -> None:
    rows = [{"step": i, "reward_mean": i / 10} for i in range(1, 8)]
    path = plot_rewards(rows, tmp_path / "curve.png", {"after warm start": 0.2, "after GRPO": None})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp*"))
    assert orjson.dumps(rows)  # rows stay JSON-friendly
