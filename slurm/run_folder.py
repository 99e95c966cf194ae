"""The run folder on shared storage: what a submitted run keeps beside what every run keeps
(deepdive/run_paths.py's RunPaths: checkpoints, logs/tensorboard, trajectories, ..., which
RunFolder extends), and the notes its nodes leave each other there.

    RUN/config.toml             the experiment, resolved (what every attempt runs)
    RUN/command.txt             the training command line of the last attempt
    RUN/jobs.jsonl              every submission: job id, time, nodes
    RUN/finished.json           the run ended well; submitting it again does nothing
    RUN/save_timing.json        the trainer's newest save: its step and time (slurm/node/preemption.py)
    RUN/submitit/               submitit's folder: the pickled job, sbatch scripts, task logs
    RUN/attempts/JOB-RESTART/   one folder per attempt (a requeue is a new attempt):
        node-K.log                  node K's console: bootstrap, and on node 0 the trainer
        node-K/                     node K's service logs, configs and ready files
                                    (NAME.log, NAME.toml, NAME.ready.json), `ray start`'s log
        node-K/ray/                 Ray's session logs on node K (every actor's output), copied
                                    when its Ray stops
        node-K.phases.jsonl         node K's phases, timestamped
        storage/node-K              node K's proof that it writes where the others read
        head.json                   the Ray head's address and host (node 0)
        data.json                   the backend's data is ready (node 0)
        node-K.json                 node K is ready: its ports and service URLs (each a list)
        cluster.json                node 0: every node ready, its URLs (slurm/cluster_note.py)
        failed-node-K.json          node K failed: the phase and why
        end.json                    node 0: the trainer ended (exit code), everyone stops
        requeue-asked.json          node 0's submitit asked for a requeue (slurm/requeue.py)
        requeue-answer.json         Slurm's answer, from the batch script once srun returned
    RUN/checkpoints, logs/, ...  RunPaths' (the backend's checkpoints, metrics, trajectories)

Every note is written whole (a partial file renamed into place), so a reader on another node
sees either nothing or all of it. The run folder and the submitit folder are private (0700).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from deepdive.run_paths import RunPaths
from services.base.files import atomic_write_bytes

# written by shell scripts (slurm/requeue.py), read here
REQUEUE_ASKED = "requeue-asked.json"
REQUEUE_ANSWER = "requeue-answer.json"


def write_json(path: Path, value: Any) -> None:
    atomic_write_bytes(path, orjson.dumps(value, option=orjson.OPT_INDENT_2) + b"\n")


def read_json(path: Path) -> Any:
    """The note at `path`, or None while there is none (or it cannot be read yet)."""
    try:
        return orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None


def private_folder(path: Path) -> Path:
    """`path` and any missing parents created; `path` itself readable by its owner only."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


@dataclass(frozen=True)
class AttemptFolder:
    root: Path

    def node_log(self, node: int) -> Path:
        return self.root / f"node-{node}.log"

    def node_logs(self, node: int) -> Path:
        return self.root / f"node-{node}"

    def phases(self, node: int) -> Path:
        return self.root / f"node-{node}.phases.jsonl"

    def storage_probe(self, node: int) -> Path:
        return self.root / "storage" / f"node-{node}"

    @property
    def head(self) -> Path:
        return self.root / "head.json"

    @property
    def data(self) -> Path:
        return self.root / "data.json"

    def ready(self, node: int) -> Path:
        return self.root / f"node-{node}.json"

    def failed(self, node: int) -> Path:
        return self.root / f"failed-node-{node}.json"

    @property
    def end(self) -> Path:
        return self.root / "end.json"

    @property
    def cluster(self) -> Path:
        return self.root / "cluster.json"

    @property
    def requeue_asked(self) -> Path:
        return self.root / REQUEUE_ASKED

    @property
    def requeue_answer(self) -> Path:
        return self.root / REQUEUE_ANSWER

    def failures(self) -> list[dict[str, Any]]:
        found = []
        for path in sorted(self.root.glob("failed-node-*.json")):
            note = read_json(path)
            if isinstance(note, dict):
                found.append(note)
        return found


@dataclass(frozen=True)
class RunFolder(RunPaths):
    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def command(self) -> Path:
        return self.root / "command.txt"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs.jsonl"

    @property
    def finished(self) -> Path:
        return self.root / "finished.json"

    @property
    def submitit(self) -> Path:
        return self.root / "submitit"

    @property
    def save_timing(self) -> Path:
        return self.root / "save_timing.json"

    @property
    def attempts(self) -> Path:
        return self.root / "attempts"

    def attempt(self, name: str) -> AttemptFolder:
        return AttemptFolder(self.attempts / name)

    def attempts_in_order(self) -> list[AttemptFolder]:
        """Every attempt, the first begun first (by job id, then requeue count)."""
        names = [path.name for path in self.attempts.glob("*-*") if path.is_dir()]
        return [self.attempt(name) for name in sorted(names, key=_attempt_order)]

    def latest_attempt(self) -> AttemptFolder | None:
        """The attempt begun last."""
        attempts = self.attempts_in_order()
        return attempts[-1] if attempts else None

    def record_command(self, argv: list[str]) -> None:
        """command.txt, quoted as a shell reads it: pasted into a shell, it runs that argv."""
        atomic_write_bytes(self.command, (shlex.join(argv) + "\n").encode())

    def recorded_command(self) -> list[str] | None:
        """The argv command.txt holds, or None before the first attempt wrote it."""
        try:
            text = self.command.read_bytes().decode()
        except FileNotFoundError:
            return None
        return shlex.split(text)

    def submitted_jobs(self) -> list[dict[str, Any]]:
        try:
            lines = self.jobs.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        return [orjson.loads(line) for line in lines if line.strip()]

    def record_job(self, job: dict[str, Any]) -> None:
        with self.jobs.open("ab") as out:
            out.write(orjson.dumps(job) + b"\n")


def _attempt_order(name: str) -> tuple[int, int]:
    job, _, restart = name.rpartition("-")
    digits = "".join(ch for ch in job if ch.isdigit())
    return (int(digits or 0), int(restart) if restart.isdigit() else 0)
