"""What the CLI asks Slurm after submission: a job's state, and cancelling it. Slurm's own
client commands (squeue, scontrol, scancel), with their output parsed here only."""

from __future__ import annotations

import shutil
import subprocess

from services.base.errors import ConfigError


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    if shutil.which(command[0]) is None:
        raise ConfigError(f"{command[0]} is not on PATH: is this a Slurm login node?")
    return subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)  # noqa: S603


def job_state(job_id: str) -> str | None:
    """PENDING, RUNNING, REQUEUED, COMPLETED, FAILED, ... (None once Slurm has forgotten it)."""
    result = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    state = result.stdout.strip()
    if result.returncode == 0 and state:
        return state.splitlines()[0]
    result = _run(["scontrol", "-o", "show", "job", job_id])
    for field in result.stdout.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def cancel(job_id: str) -> None:
    result = _run(["scancel", job_id])
    if result.returncode != 0:
        raise ConfigError(f"scancel {job_id}: {result.stderr.strip() or 'failed'}")
