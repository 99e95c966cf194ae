"""A task's CPUs on both sides of a site's task plugin, on the private Slurm (Debian's 22.05.8).

Slurm 22.05 to 23.02's srun does not read sbatch's --cpus-per-task (SLURM_CPUS_PER_TASK): a
step started without its own gets one CPU per task, and where tasks are bound to cores
(task/affinity with TaskPluginParam=Cores here, as task/cgroup's ConstrainCores binds them) the
node's whole stack then runs on one core. Measured here on 2a5d2bd's script: sbatch
--cpus-per-task=2, `srun` alone gives the task affinity [0], `srun --cpus-per-task=2` [0, 1]. With
task/none nothing binds: the affinity is the host's, and Slurm's count bounds what the
bootstrap sizes to."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.helpers import (
    DEEPDIVE,
    LOCAL_SLURM,
    TINY_JOB,
    job_fields,
    job_left_queue,
    submitted_job_id,
    tiny_job,
    wait_until,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def cluster_up(env: dict[str, str], task_plugin: str) -> None:
    """The session's cluster again, with this task plugin (the script restarts its daemons
    when the configuration it writes changes)."""
    up = subprocess.run(
        [str(LOCAL_SLURM), "up"],
        env={**env, "TASK_PLUGIN": task_plugin},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert up.returncode == 0, up.stdout + up.stderr
    config = (Path(env["SLURM_CONF"])).read_text()
    assert f"TaskPlugin={task_plugin}\n" in config


@pytest.fixture
def core_binding(job_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The cluster with every task bound to its step's cores, for one test; task/none after."""
    cluster_up(job_env, "task/affinity")
    try:
        yield job_env
    finally:
        cluster_up(job_env, "task/none")


def run_job(env: dict[str, str], run: Path, *sets: str) -> list[dict[str, Any]]:
    """A one-step tiny job, to its end; every node's job start record."""
    result = subprocess.run(
        [*DEEPDIVE, "submit", *tiny_job(run, 1, *sets)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = submitted_job_id(result.stdout)
    wait_until(lambda: job_left_queue(job_id, env), 300, "the job to end")
    assert job_fields(job_id, env)["JobState"] == "COMPLETED", job_fields(job_id, env)
    (attempt,) = (run / "attempts").iterdir()
    starts = []
    for node in (0, 1):
        lines = (attempt / f"node-{node}.phases.jsonl").read_bytes().splitlines()
        records = [orjson.loads(line) for line in lines]
        starts += [r for r in records if (r["phase"], r["event"]) == ("job", "start")]
    return starts


def smoke_cpus(env: dict[str, str], run: Path, cpus: int) -> dict[int, dict[str, Any]]:
    """The kit's step 1 as a 2-node job: each node's CPUs check."""
    result = subprocess.run(
        [*DEEPDIVE, "smoke", str(TINY_JOB), "--only", "image", "--keep-going", "--wait",
         "--set", f'run.folder="{run}"', "--set", f"slurm.cpus_per_task={cpus}"],
        env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600,
        cwd=ROOT,
    )  # fmt: skip
    job = submitted_job_id(result.stdout)
    report = orjson.loads((run / "smoke" / job / "report.json").read_bytes())
    return {
        result_["node"]: check
        for result_ in report["results"]
        for check in result_["checks"]
        if check["name"] == "CPUs"
    }


def test_with_core_binding_each_node_runs_on_the_cpus_it_asked_for(
    core_binding: dict[str, str], tmp_path: Path
) -> None:
    """On 2a5d2bd (srun without --cpus-per-task) each node's affinity was 1 CPU of 2 asked."""
    starts = run_job(core_binding, tmp_path / "run", "slurm.cpus_per_task=2")
    assert [start["node"] for start in starts] == [0, 1]
    for start in starts:
        assert (start["cpus_affinity"], start["cpus_slurm"], start["cpus"]) == (2, 2, 2), start
        assert "cpus_differ" not in start


def test_with_core_binding_the_kit_checks_the_cpus_of_every_node(
    core_binding: dict[str, str], tmp_path: Path
) -> None:
    checks = smoke_cpus(core_binding, tmp_path / "run", 2)
    assert sorted(checks) == [0, 1]
    for check in checks.values():
        assert check["ok"], check
        assert check["detail"] == "2 in the task's affinity, 2 asked"


def test_without_binding_the_stack_keeps_to_what_slurm_gave_and_says_why(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    """task/none: the task may run on every CPU of the host; Slurm gave it one."""
    host = len(os.sched_getaffinity(0))
    starts = run_job(job_env, tmp_path / "run", "slurm.cpus_per_task=1")
    for start in starts:
        assert (start["cpus_affinity"], start["cpus_slurm"], start["cpus"]) == (host, 1, 1)
        if host > 1:
            assert "task/none" in start["cpus_differ"], start
