"""`deepdive status` reads the step and the reward from the TensorBoard events the trainer
writes: slime's (`--use-tensorboard`, TENSORBOARD_DIR: RUN/logs/tensorboard, its tag names at
624b824) and the local backend's. The files here are written by tensorboardX, as a real writer
leaves them: several processes' files side by side, a requeued attempt writing its steps again,
a record cut short at the end of a live file."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import orjson
import pytest

from slurm.run_folder import RunFolder
from slurm.view.status import run_status
from tests.helpers import DEEPDIVE

tensorboardX = pytest.importorskip("tensorboardX")


def write(folder: Path, scalars: list[tuple[str, float, int]], suffix: str) -> Path:
    writer = tensorboardX.SummaryWriter(str(folder), filename_suffix=suffix)
    for tag, value, step in scalars:
        writer.add_scalar(tag, value, step)
    writer.close()
    (path,) = folder.glob(f"*{suffix}")
    return path


def test_status_shows_a_slime_runs_step_and_reward_from_its_tensorboard_events(
    tmp_path: Path,
) -> None:
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    (run.root / "config.toml").write_text('[run]\nfolder = "x"\n')
    events = run.root / "logs" / "tensorboard"  # RunFolder.tensorboard, spelled out
    # the rollout manager and the trainer each write their own file (slime/observability:
    # rollout/* with step "rollout/step", train/* with "train/step", eval/* with "eval/step")
    write(events, [("rollout/raw_reward", 0.1 * s, s) for s in range(1, 8)], ".rollout")
    write(events, [("train/loss", 1.0 / s, s) for s in range(1, 30)], ".train")
    write(events, [("eval/bc", 0.5, 5)], ".eval")
    time.sleep(0.01)
    # a requeue resumed from step 5 and has written 6 again since: the run is at step 6
    requeued = write(events, [("rollout/raw_reward", 0.9, 6)], ".requeued")
    with requeued.open("ab") as live:  # the writer was in the middle of its next record
        live.write(b"\x40\x00\x00\x00\x00\x00\x00\x00\x01\x02")
    status = run_status(run)
    assert status.step == 6 and status.reward == pytest.approx(0.9)

    shown = subprocess.run(
        [*DEEPDIVE, "status", str(run.root), "--json"], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout)["step"] == 6


def test_status_reads_the_local_backends_events_too(tmp_path: Path) -> None:
    run = RunFolder(tmp_path)
    write(
        run.root / "logs" / "tensorboard",
        [("reward_mean", 0.25, 1), ("reward_mean", 0.5, 2)],
        ".local",
    )
    status = run_status(run)
    assert (status.step, status.reward) == (2, 0.5)


def test_status_shows_the_agents_statistics_of_the_rewards_step(tmp_path: Path) -> None:
    """slime's, as our rollout log function adds them to its rollout metrics (logged with
    step "rollout/step", slime/observability/rollout_metrics.py, lines 263-271, at 624b824),
    and the local backend's (agent/...), each of the newest step only."""
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    (run.root / "config.toml").write_text('[run]\nfolder = "x"\n')
    agent = "rollout/deepdive/agent/"
    write(
        run.tensorboard,
        [
            ("rollout/raw_reward", 0.25, 3),
            (agent + "tool_calls/search", 9.0, 3),
            ("rollout/raw_reward", 0.5, 4),
            (agent + "tool_calls/search", 2.5, 4),
            (agent + "finish_rate", 0.75, 4),
            (agent + "reward_by_searches/4_or_more", 0.125, 4),
        ],
        ".rollout",
    )
    status = run_status(run)
    assert status.agent == {
        "tool_calls/search": 2.5,
        "finish_rate": 0.75,
        "reward_by_searches/4_or_more": 0.125,
    }
    shown = subprocess.run([*DEEPDIVE, "status", str(run.root)], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "agent     search 2.50, finished 75% (per episode)" in shown.stdout
    local = RunFolder(tmp_path / "local")
    write(local.tensorboard, [("reward_mean", 0.5, 1), ("agent/turns", 3.0, 1)], ".local")
    assert run_status(local).agent == {"turns": 3.0}


def test_status_says_what_a_requeue_would_redo(tmp_path: Path) -> None:
    """The newest complete checkpoint (Megatron's tracker, for slime) against the newest step
    logged: the steps a requeue now loses and redoes. 2a5d2bd's status did not say."""
    run = RunFolder(tmp_path / "run")
    run.root.mkdir()
    (run.root / "config.toml").write_text(f'[run]\nfolder = "{run.root}"\nbackend = "slime"\n')
    write(
        run.root / "logs" / "tensorboard", [("rollout/raw_reward", 0.5, s) for s in range(9)], ".r"
    )
    assert run_status(run).redo == "every step so far (1-8): no checkpoint yet"
    checkpoints = run.root / "slime_checkpoints"
    (checkpoints / "iter_0000005").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("5")
    status = run_status(run)
    assert (status.checkpoint, status.step) == (5, 8)
    assert status.redo == "3 step(s), 6-8, since the checkpoint at step 5"
    shown = subprocess.run([*DEEPDIVE, "status", str(run.root)], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    assert "checkpoint step 5 (a requeue now redoes 3 step(s), 6-8" in shown.stdout
