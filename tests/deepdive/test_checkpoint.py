"""Atomic checkpoints, the prompt sampler's position, and the metrics log a resume rewinds."""

from __future__ import annotations

import logging
import os
import random
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

torch = pytest.importorskip("torch")

from deepdive.local.checkpoint import (  # noqa: E402
    META_FILE,
    STATE_FILE,
    checkpoints,
    load_latest,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from deepdive.local.prompts import PromptSampler  # noqa: E402
from deepdive.local.run_log import RunLog, plot_rewards  # noqa: E402


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


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_only_the_newest_are_kept(tmp_path: Path) -> None:
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, {"value": step}, keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-000004", "step-000005"]
    assert _names(tmp_path) == ["step-000004", "step-000005"]  # nothing set aside stays behind
    assert load_latest(tmp_path / "absent") is None


def _skipped(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The checkpoint_skipped lines load_latest logged, at WARNING."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "deepdive.local.checkpoint" and r.levelno == logging.WARNING
        if r.getMessage().startswith("checkpoint_skipped ")
    ]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        # rmtree(step) killed after state.pt went: the old rewrite's "FileNotFoundError"
        (lambda step: (step / STATE_FILE).unlink(), "state.pt missing"),
        (lambda step: (step / STATE_FILE).write_bytes(b"PK\x03\x04 cut"), "state.pt unreadable"),
        (lambda step: (step / META_FILE).unlink(), "meta.json missing"),
        (lambda step: (step / META_FILE).write_bytes(b'{"st'), "meta.json unreadable"),
        (lambda step: (step / META_FILE).write_bytes(b'{"step": 9}'), "meta.json names step 9"),
    ],
    ids=["no-state", "cut-state", "no-meta", "cut-meta", "wrong-meta"],
)
def test_load_latest_skips_a_broken_newest_checkpoint_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Callable[[Path], object], reason: str
) -> None:
    save_checkpoint(tmp_path, 1, {"value": 1})
    damage(save_checkpoint(tmp_path, 2, {"value": 2}))
    with caplog.at_level(logging.WARNING, logger="deepdive.local.checkpoint"):
        assert load_latest(tmp_path) == (1, {"value": 1})
    (line,) = _skipped(caplog)
    assert f"folder={tmp_path / 'step-000002'}" in line and reason in line
    save_checkpoint(tmp_path, 2, {"value": 2})  # redoing the step replaces the broken folder
    assert load_latest(tmp_path) == (2, {"value": 2})


def test_a_kill_between_the_renames_of_a_rewrite_keeps_the_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    save_checkpoint(tmp_path, 3, {"value": 30}, keep=1)
    save_checkpoint(tmp_path, 3, {"value": 31}, keep=1)  # a resumed run redoing step 3
    assert _names(tmp_path) == ["step-000003"] and load_latest(tmp_path) == (3, {"value": 31})
    # The kill came after the old step 3 went aside and before the new one was renamed in: the
    # aside copy is then the only complete checkpoint, and must load.
    (tmp_path / "step-000003").rename(tmp_path / "step-000003.aside-4242-0a1b2c3d")
    save_checkpoint(tmp_path / "other", 3, {"value": 32}).rename(tmp_path / "step-000003.tmp-4242")
    (tmp_path / "other").rmdir()
    with caplog.at_level(logging.WARNING, logger="deepdive.local.checkpoint"):
        assert load_latest(tmp_path) == (3, {"value": 31})
    assert _skipped(caplog) == []  # nothing newer was tried
    save_checkpoint(tmp_path, 4, {"value": 40}, keep=1)
    assert _names(tmp_path) == ["step-000004"]


def test_a_kill_inside_pruning_leaves_nothing_behind_after_the_next_save(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, {"value": step}, keep=2)
    # An rmtree killed in an old step: meta.json went first (never loadable, never pruned by
    # name); and a pruned step renamed aside, half deleted; and a temporary folder.
    (tmp_path / "step-000001").mkdir()
    (tmp_path / "step-000001" / STATE_FILE).write_bytes(b"old")
    aside = tmp_path / "step-000002.aside-4242-0a1b2c3d"
    (tmp_path / "step-000002").rename(aside)
    (aside / META_FILE).unlink()
    (tmp_path / "step-000004.tmp-4242").mkdir()
    assert load_latest(tmp_path) == (3, {"value": 3})
    save_checkpoint(tmp_path, 4, {"value": 4}, keep=2)
    assert _names(tmp_path) == ["step-000003", "step-000004"]
    assert load_latest(tmp_path) == (4, {"value": 4})


# A fork server: it imports torch once, then forks one worker per line on stdin and prints its pid,
# then "reaped" once the test has killed it. Each worker resumes like a run: it loads the newest
# checkpoint and saves that step again, then saves the next steps (odd ones twice). It keeps one
# checkpoint only: every rewrite replaces the sole checkpoint, every new step prunes it.
_KILL_SEED = 20240611
_FORK_SERVER = """
import os, sys
from pathlib import Path

import torch

from deepdive.local.checkpoint import load_latest, save_checkpoint

folder, progress, size = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])


def work():
    latest = load_latest(folder)
    step = 0 if latest is None else latest[0]
    done = os.open(progress, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    while True:
        for _ in range(1 + step % 2):
            state = {"step": step, "data": torch.full((size,), float(step))}
            save_checkpoint(folder, step, state, keep=1)
            os.write(done, f"{step}\\n".encode())
        step += 1


for _ in sys.stdin:
    pid = os.fork()
    if pid == 0:
        work()
    print(pid, flush=True)
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def _kill_moment(rng: random.Random, folder: Path) -> None:
    """Return at a random moment of a worker's life; half the time, during a save's last steps.

    Renames and deletions take a few milliseconds of a save's tens, so kills at uniform moments
    seldom land there: every other kill waits for a temporary folder that holds meta.json (its
    save is about to sync, rename and delete) and strikes within the next few tens of milliseconds.
    """
    if rng.random() < 0.5:
        time.sleep(rng.uniform(0.0, 0.3))
        return
    deadline = time.monotonic() + 2
    while not any(folder.glob("step-*.tmp-*/meta.json")) and time.monotonic() < deadline:
        time.sleep(0.0002)
    time.sleep(rng.uniform(0.0, 0.05))


def _completed(progress: Path) -> list[int]:
    """The steps whose save_checkpoint returned, as the killed workers recorded them."""
    return [int(line) for line in progress.read_text().split()] if progress.exists() else []


@pytest.mark.slow
def test_sigkill_at_random_moments_never_loses_a_completed_checkpoint(tmp_path: Path) -> None:
    folder, progress, size = tmp_path / "checkpoints", tmp_path / "progress", 1_000_000  # 4 MB
    rng = random.Random(_KILL_SEED)
    command = [sys.executable, "-c", _FORK_SERVER, str(folder), str(progress), str(size)]
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as server:
        assert server.stdin is not None and server.stdout is not None
        worker = 0  # the pid of a worker still running, if any
        try:
            for _ in range(24):
                server.stdin.write("go\n")
                server.stdin.flush()
                worker = int(server.stdout.readline())
                _kill_moment(rng, folder)
                os.kill(worker, signal.SIGKILL)
                worker = 0
                assert server.stdout.readline() == "reaped\n"  # gone: nothing more can land
                completed, latest = _completed(progress), load_latest(folder)
                if not completed:
                    continue
                assert latest is not None
                step, state = latest
                assert step >= max(completed)  # nothing a returned save wrote was lost
                assert state["step"] == step
                assert torch.equal(state["data"], torch.full((size,), float(step)))
        finally:
            if worker:
                os.kill(worker, signal.SIGKILL)
            server.stdin.close()  # the server leaves its loop; leaving `with` waits for it
    assert latest is not None and max(_completed(progress)) >= 2  # rewrites and prunes happened
    save_checkpoint(folder, latest[0] + 1, {}, keep=1)  # and this save cleans what the kills left
    assert _names(folder) == [f"step-{latest[0] + 1:06d}"]


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
    """The records of the folder's TensorBoard event files (length, crc, data, crc): one per
    writer, unless two writers open theirs within one second (the name holds the second)."""
    paths = sorted(folder.glob("events.out.tfevents.*"))
    assert paths, f"no event file in {folder}"
    records: list[bytes] = []
    for path in paths:
        data, offset = path.read_bytes(), 0
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
