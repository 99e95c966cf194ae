"""The warning's save (slurm/node/preemption.py, deepdive/save_timing.py, the slime driver) with real
processes: node 0's decision against a trainer that handles the warning or ignores it, slime's
train.py through our driver, and what `deepdive status` says of it. The whole job on Slurm is
tests/slurm/test_jobs.py::test_a_warned_job_saves_at_the_next_step_and_resumes_there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from deepdive.save_timing import SAVE_TIMING_ENV, WARNING_SIGNAL, SaveTimer, read_save_record
from slurm import requeue
from slurm.node.preemption import WarnedSave, stop_reserve_s
from slurm.run_folder import RunFolder, write_json
from slurm.view.status import last_warning
from tests.helpers import FakeClock, wait_until

ROOT = Path(__file__).resolve().parents[2]

# A trainer's loop as the local backend's: steps of 0.05 s, a save when warned (deepdive's own
# WarningFlag and SaveTimer), a progress file per step.
TRAINER = """
import sys, time
from pathlib import Path
from deepdive.save_timing import SaveTimer, WarningFlag
warning, timer = WarningFlag().install(), SaveTimer.from_environment()
progress = Path(sys.argv[1])
for step in range(1, 10_000):
    time.sleep(0.05)
    progress.write_text(str(step))
    if warning.warned:
        started = time.monotonic()
        time.sleep(0.1)
        timer.saved(step, time.monotonic() - started)
"""

# slime's train.py at 624b824 as far as the driver touches it (slime needs GPUs and is not in
# CI): `create_training_models` bound in train.py's namespace (train.py:4) and called in
# train(args) (train.py:21); after each rollout's training, a save when
# should_run_periodic_action(rollout_id, args.save_interval, ...) says so (train.py:71-76; true
# when (rollout_id + 1) % interval == 0, slime/utils/misc.py:107-128), the data source's
# state (train.py:79-80), then update_weights (train.py:85).
SLIME_TRAIN = """
import time
from pathlib import Path
from slime.placement import create_training_models

def should_run_periodic_action(rollout_id, interval):
    return interval is not None and (rollout_id + 1) % interval == 0

def train(args):
    actor, critic = create_training_models(args)
    for rollout_id in range(args.num_rollout):
        time.sleep(0.05)
        Path(args.progress).write_text(str(rollout_id))
        if should_run_periodic_action(rollout_id, args.save_interval):
            actor.save_model(rollout_id)
            time.sleep(0.05)  # the data source's state
            Path(args.progress + ".data").write_text(str(rollout_id))
        actor.update_weights()
"""
SLIME_PLACEMENT = """
import time
from pathlib import Path

class Actor:
    def __init__(self, args):
        self.args = args

    def save_model(self, rollout_id, force_sync=False):
        time.sleep(0.1)
        Path(self.args.progress + ".saves").open("a").write(f"{rollout_id}\\n")

    def update_weights(self):
        pass

def create_training_models(args):
    return Actor(args), None
"""
SLIME_ARGUMENTS = """
import argparse

def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--save-interval", type=int)
    parser.add_argument("--num-rollout", type=int)
    parser.add_argument("--progress")
    return parser.parse_args()
"""


@pytest.fixture
def child() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def start(
    command: list[str], record: Path, cwd: Path | None = None, path: str = str(ROOT)
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": path, SAVE_TIMING_ENV: str(record)}
    return subprocess.Popen(command, env=env, cwd=cwd)


def test_the_warning_signal_is_the_one_slurm_sends() -> None:
    assert WARNING_SIGNAL == requeue.PREEMPT_SIGNAL == signal.SIGURG


def test_a_warned_trainer_saves_at_its_next_step_and_node_0_waits_for_it(
    tmp_path: Path, child: list[subprocess.Popen[bytes]]
) -> None:
    record, progress = tmp_path / "save_timing.json", tmp_path / "step"
    trainer = start([sys.executable, "-c", TRAINER, str(progress)], record)
    child.append(trainer)
    wait_until(lambda: progress.is_file() and int(progress.read_text() or 0) >= 3, 60, "step 3")
    assert read_save_record(record) is None  # no save before the warning
    outcome = WarnedSave(record, signal_delay_s=60, stop_timeout_s=2).run(trainer)
    assert outcome["save"] == "saved", outcome
    assert outcome["saved_step"] >= 3
    assert outcome["save_s"] >= 0.1  # the save's own time, measured by the trainer
    assert trainer.poll() is None  # node 0 stops it afterwards, with every other child


def test_no_save_is_tried_when_a_measured_save_does_not_fit_the_warning(
    tmp_path: Path, child: list[subprocess.Popen[bytes]]
) -> None:
    record, progress = tmp_path / "save_timing.json", tmp_path / "step"
    SaveTimer(record).saved(5, 50.0)  # a save took 50 s; 60 s less the reserve leaves 41 s
    trainer = start([sys.executable, "-c", TRAINER, str(progress)], record)
    child.append(trainer)
    wait_until(lambda: progress.is_file(), 60, "the trainer's first step")
    outcome = WarnedSave(record, signal_delay_s=60, stop_timeout_s=2).run(trainer)
    assert outcome["save"] == "skipped"
    assert "a save takes 50.0 s" in outcome["why"] and "leaves 41.0 s" in outcome["why"]
    time.sleep(0.5)
    assert read_save_record(record).step == 5  # type: ignore[union-attr]  # not warned: no save
    assert stop_reserve_s(2) == 19


def test_node_0_gives_up_when_no_save_ends_in_time(
    tmp_path: Path, child: list[subprocess.Popen[bytes]]
) -> None:
    """A trainer that never saves (it ignores the warning): the wait ends at the warning's
    time less the reserve, on node 0's clock."""
    sleeper = start([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "r.json")
    child.append(sleeper)
    clock = FakeClock()
    outcome = WarnedSave(tmp_path / "r.json", 30, 2, clock=clock, sleep=clock.sleep).run(sleeper)
    assert outcome["save"] == "timed out" and "within 11.0 s" in outcome["why"]
    assert 10.9 <= sum(clock.sleeps) <= 11.4


def test_slimes_train_py_through_the_driver_saves_at_the_next_rollout_once_warned(
    tmp_path: Path, child: list[subprocess.Popen[bytes]]
) -> None:
    slime_root = tmp_path / "slime"
    (slime_root / "slime" / "utils").mkdir(parents=True)
    (slime_root / "train.py").write_text(SLIME_TRAIN)
    (slime_root / "slime" / "placement.py").write_text(SLIME_PLACEMENT)
    (slime_root / "slime" / "utils" / "arguments.py").write_text(SLIME_ARGUMENTS)
    progress, record = tmp_path / "rollout", tmp_path / "save_timing.json"
    argv = ["--save-interval", "1000", "--num-rollout", "100000", "--progress", str(progress)]
    driver = [sys.executable, "-m", "slurm.backends.slime.driver", *argv]
    trainer = start(driver, record, cwd=slime_root, path=str(ROOT))
    child.append(trainer)
    wait_until(lambda: progress.is_file() and int(progress.read_text() or 0) >= 3, 60, "rollout 3")
    assert not Path(f"{progress}.saves").exists()  # every 1000 rollouts: none yet
    outcome = WarnedSave(record, signal_delay_s=60, stop_timeout_s=2).run(trainer)
    assert outcome["save"] == "saved", outcome
    saved = outcome["saved_step"]
    assert saved >= 3
    # the save counted once the data source's state was written too (train.py:79-80)
    assert int(Path(f"{progress}.data").read_text()) >= saved
    assert outcome["save_s"] >= 0.15  # save_model's 0.1 s and the data state's 0.05 s
    assert int(Path(f"{progress}.saves").read_text().split()[0]) == saved


def test_status_says_what_the_warning_saved_and_what_the_requeue_lost(tmp_path: Path) -> None:
    run = RunFolder(tmp_path / "run")
    first, second = run.attempt("7-0"), run.attempt("7-1")
    for attempt in (first, second):
        attempt.root.mkdir(parents=True)
    warning = {
        "save": "saved",
        "saved_step": 6,
        "save_s": 1.5,
        "waited_s": 3.2,
        "step": 7,
        "checkpoint": 6,
        "lost": "1 step(s), 7-7, since the checkpoint at step 6",
    }
    write_json(first.end, {"stopped": "signal", "requeue": True, "warning": warning})
    said = last_warning(run)
    assert said == (
        "attempt 7-0: saved step 6 at the next rollout boundary (1.5 s save, 3.2 s after the "
        "warning); the requeue lost 1 step(s), 7-7, since the checkpoint at step 6"
    )
    skipped = {"save": "skipped", "why": "a save takes 120.0 s", "lost": "4 step(s), 3-6"}
    write_json(second.end, {"stopped": "signal", "requeue": True, "warning": skipped})
    assert last_warning(run) == (
        "attempt 7-1: no save on the warning (skipped: a save takes 120.0 s); the requeue "
        "lost 4 step(s), 3-6"
    )
    assert orjson.loads(second.end.read_bytes())["warning"]["save"] == "skipped"
