"""Job start -> every node in Ray with its services ready -> the first training step, on a
2-node Slurm (scripts/local-slurm.sh, two emulated nodes on this host), held against a plain
submitit job that only starts Ray on both nodes (benchmarks/plain_ray.py) on the same cluster.

Pairs of jobs run one after another, the two kinds taking turns going first (the machine is
shared: its load drifts, and a pair sees the same load). The project's job is
configs/cluster-tiny.toml with its warm start, evaluation and GRPO cut to what delays the
first step. Every time is on the job's own clock, from its first task's process start (the
kernel's record, before Python loads anything), so the bootstrap's imports count as the plain
job's do:

    plain joined     the last node's `ray start` says "Ray runtime started."
    ready            node 0 has every node's ready note (Ray joined, services answering)
    first step       the trainer begins its first GRPO step ("training started")

and each pair gives the ratios ready / plain joined and first step / plain joined. The phases
overlap on purpose (node 0's trainer loads its libraries while the other nodes join), so the
table gives each phase's duration and where it ended on the job's clock, not shares that add up.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "local-slurm.sh"
CONFIG = ROOT / "configs" / "cluster-tiny.toml"
# DIR:CTLD_PORT:SLURMD_PORT0 of the benchmark's own cluster (as DEEPDIVE_TEST_SLURM for tests)
CLUSTER_ENV = "DEEPDIVE_BENCH_SLURM"
CLUSTER = "/tmp/deepdive-slurm-bench:16837:17050"
FAST_START = [
    "local.warm_start.epochs=0",
    "local.warm_start.copy_steps=0",
    "local.eval.before=false",
    "local.grpo.steps=1",
]
JOB_TIMEOUT_S = 300.0
GOALS = {"ready": 1.3, "first_step": 1.8}  # issue 23: at most these times the plain join


def _phases(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _wait(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark job did not end in time")
        time.sleep(delay)
        delay = min(0.5, delay * 1.5)


def _submit_and_wait(command: list[str], env: dict[str, str]) -> str:
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    found = re.search(r"submitted job (\d+)", result.stdout)
    assert found, result.stdout + result.stderr
    job_id = found.group(1)

    def gone() -> bool:
        queue = subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True)
        return not queue.stdout.strip()

    _wait(gone, JOB_TIMEOUT_S)
    return job_id


def project_job(env: dict[str, str], folder: Path) -> dict[str, Any]:
    overrides = [f'run.folder="{folder}"', *FAST_START]
    command = [sys.executable, "-m", "slurm.cli", "submit", str(CONFIG)]
    command += [item for value in overrides for item in ("--set", value)]
    job_id = _submit_and_wait(command, env)
    attempt = folder / "attempts" / f"{job_id}-0"
    nodes = {node: _phases(attempt / f"node-{node}.phases.jsonl") for node in (0, 1)}
    # the job's clock: its first task's process start (older bootstraps: its first line)
    start = min(lines[0].get("process_started", lines[0]["t"]) for lines in nodes.values())
    head = {(line["phase"], line["event"]): line["t"] - start for line in nodes[0]}
    phases: dict[str, dict[str, float]] = {}
    for node, lines in nodes.items():
        phases[f"node {node} python + imports"] = {
            "seconds": round(lines[0]["t"] - lines[0].get("process_started", lines[0]["t"]), 2),
            "ended_at_s": round(lines[0]["t"] - start, 2),
        }
        begun = {}
        for line in lines:
            if line["event"] == "start":
                begun[line["phase"]] = line["t"]
            elif line["event"] == "done" and line["phase"] in begun:
                phases[f"node {node} {line['phase']}"] = {
                    "seconds": round(line["t"] - begun[line["phase"]], 2),
                    "ended_at_s": round(line["t"] - start, 2),
                }
    first_step = head[("training_started", "event")]
    trainer = head.get(("trainer_started", "event"), head[("training", "start")])
    phases["node 0 trainer (start -> first step)"] = {
        "seconds": round(first_step - trainer, 2),
        "ended_at_s": round(first_step, 2),
    }
    return {
        "job": job_id,
        "ready_s": round(head[("join", "done")], 2),
        "first_step_s": round(first_step, 2),
        "phases": phases,
    }


def plain_job(env: dict[str, str], folder: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "benchmarks.plain_ray", str(folder)]
    job_id = _submit_and_wait(command, env)
    paths = [folder / f"node-{node}.json" for node in (0, 1)]
    if not all(path.exists() for path in paths):
        raise RuntimeError(f"the plain job {job_id} failed: see {folder / 'submitit' / job_id}")
    notes = [orjson.loads(path.read_bytes()) for path in paths]
    start = min(note["process_started"] for note in notes)
    return {
        "job": job_id,
        "joined_s": round(max(note["ray_started"] for note in notes) - start, 2),
        "nodes_joined_s": [round(note["ray_started"] - start, 2) for note in notes],
    }


def run(pairs: int = 3) -> dict[str, Any]:
    directory, ctld, slurmd = os.environ.get(CLUSTER_ENV, CLUSTER).split(":")
    env = {**os.environ, "DEEPDIVE_SLURM_DIR": directory, "CTLD_PORT": ctld, "SLURMD_PORT0": slurmd}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    subprocess.run([str(SCRIPT), "up"], env=env, check=True, capture_output=True)
    env["SLURM_CONF"] = f"{directory}/slurm.conf"
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="deepdive-bench-job-") as tmp:
            env["XDG_STATE_HOME"] = f"{tmp}/state"  # the CLI's job index, not the user's
            for k in range(pairs):
                pair: dict[str, Any] = {"first": "plain" if k % 2 == 0 else "project"}
                kinds = ("plain", "project") if k % 2 == 0 else ("project", "plain")
                for kind in kinds:
                    job = plain_job if kind == "plain" else project_job
                    pair[kind] = job(env, Path(tmp) / f"{kind}-{k}")
                plain = pair["plain"]["joined_s"]
                pair["ready_ratio"] = round(pair["project"]["ready_s"] / plain, 2)
                pair["first_step_ratio"] = round(pair["project"]["first_step_s"] / plain, 2)
                results.append(pair)
    finally:
        subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True)
    return summarize(results)


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    projects = [pair["project"] for pair in pairs]
    names = list(projects[0]["phases"])
    summary: dict[str, Any] = {
        "pairs": pairs,
        "plain_joined_s": spread([pair["plain"]["joined_s"] for pair in pairs]),
        "ready_s": spread([p["ready_s"] for p in projects]),
        "first_step_s": spread([p["first_step_s"] for p in projects]),
        "ready_ratio": spread([pair["ready_ratio"] for pair in pairs]),
        "first_step_ratio": spread([pair["first_step_ratio"] for pair in pairs]),
        "goals": GOALS,
        "median_phases": {
            name: {
                key: statistics.median(
                    p["phases"][name][key] for p in projects if name in p["phases"]
                )
                for key in ("seconds", "ended_at_s")
            }
            for name in names
        },
    }
    summary["goals_met"] = {
        name: summary[f"{name}_ratio"]["median"] <= bound for name, bound in GOALS.items()
    }
    return summary
