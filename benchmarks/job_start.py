"""Job start -> "training started" on a 2-node Slurm (scripts/local-slurm.sh, two emulated nodes
on this host): all nodes in Ray, all services ready, the first training step begun.

Submits configs/cluster-tiny.toml (with its warm start, evaluation and GRPO cut to nothing
that delays the first step) a few times, one after another, and reads each job's phase logs:
when Slurm started the job (node 0's first line), when each phase of each node began and
ended, and when the trainer announced its first step. The phases overlap on purpose (node 0
writes the data while its Ray head comes up; the trainer loads its libraries and the policy
while the other nodes join), so the table gives each phase's duration and where it ended on
the clock of the job, not shares that add up.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "local-slurm.sh"
CONFIG = ROOT / "configs" / "cluster-tiny.toml"
FAST_START = [
    "local.warm_start.epochs=0",
    "local.warm_start.copy_steps=0",
    "local.eval.before=false",
    "local.grpo.steps=1",
]


def _phases(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _wait(condition: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark job did not end in time")
        time.sleep(delay)
        delay = min(0.5, delay * 1.5)


def one_job(env: dict[str, str], folder: Path) -> dict[str, Any]:
    overrides = [f'run.folder="{folder}"', *FAST_START]
    command = [sys.executable, "-m", "slurm.cli", "submit", str(CONFIG)]
    command += [item for value in overrides for item in ("--set", value)]
    submitted_at = time.time()
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found = re.search(r"submitted job (\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    job_id = found.group(1)

    def gone() -> bool:
        queue = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True)
        return not queue.stdout.strip()

    _wait(gone, 300)
    attempt = folder / "attempts" / f"{job_id}-0"
    nodes = {node: _phases(attempt / f"node-{node}.phases.jsonl") for node in (0, 1)}
    start = nodes[0][0]["t"]
    head = {(line["phase"], line["event"]): line["t"] - start for line in nodes[0]}
    phases: dict[str, dict[str, float]] = {}
    for node, lines in nodes.items():
        begun = {}
        for line in lines:
            if line["event"] == "start":
                begun[line["phase"]] = line["t"]
            elif line["event"] == "done" and line["phase"] in begun:
                key = f"node {node} {line['phase']}"
                phases[key] = {
                    "seconds": round(line["t"] - begun[line["phase"]], 2),
                    "ended_at_s": round(line["t"] - start, 2),
                }
    trainer_started = head[("training", "start")]
    first_step = head[("training_started", "event")]
    phases["node 0 trainer (start -> first step)"] = {
        "seconds": round(first_step - trainer_started, 2),
        "ended_at_s": round(first_step, 2),
    }
    return {
        "job": job_id,
        "submit_to_job_start_s": round(start - submitted_at, 2),
        "job_start_to_training_s": round(first_step, 2),
        "phases": phases,
    }


def run(jobs: int = 3) -> dict[str, Any]:
    env = {
        **os.environ,
        "DEEPDIVE_SLURM_DIR": "/tmp/deepdive-slurm-bench",
        "CTLD_PORT": "16837",
        "SLURMD_PORT0": "17050",
    }
    subprocess.run([str(SCRIPT), "up"], env=env, check=True, capture_output=True)
    env["SLURM_CONF"] = "/tmp/deepdive-slurm-bench/slurm.conf"
    try:
        with tempfile.TemporaryDirectory(prefix="deepdive-bench-job-") as tmp:
            runs = [one_job(env, Path(tmp) / f"run-{k}") for k in range(jobs)]
    finally:
        subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True)
    names = list(runs[0]["phases"])
    return {
        "jobs": runs,
        "median_job_start_to_training_s": statistics.median(
            r["job_start_to_training_s"] for r in runs
        ),
        "median_submit_to_job_start_s": statistics.median(r["submit_to_job_start_s"] for r in runs),
        "median_phases": {
            name: {
                key: statistics.median(r["phases"][name][key] for r in runs if name in r["phases"])
                for key in ("seconds", "ended_at_s")
            }
            for name in names
        },
    }
