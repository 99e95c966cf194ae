"""What the CLI asks Slurm after submission: a job's state, and cancelling it. Slurm's own
client commands (squeue, scontrol, scancel), with their output parsed here only.

A command that is missing or fails is a fact of this machine, not of the user's input: a
SchedulerError (exit code 1), never a ConfigError."""

from __future__ import annotations

import shutil
import subprocess

from services.base.errors import RuntimeFailure


class SchedulerError(RuntimeFailure):
    """A Slurm client command is not installed here, or it failed; the message names it."""

    code = "scheduler_error"


_TIMEOUT_S = 30


def _run(command: list[str], timeout_s: float = _TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    if shutil.which(command[0]) is None:
        raise SchedulerError(f"{command[0]} is not on PATH: is this a Slurm login node?")
    try:
        return subprocess.run(  # noqa: S603
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise SchedulerError(f"{command[0]}: no answer in {timeout_s:g} s") from None
    except OSError as error:
        raise SchedulerError(f"{command[0]}: cannot run it ({error})") from None


def _said(result: subprocess.CompletedProcess[str]) -> str:
    """What a failed command said, in one line: the last line of its stderr (Slurm's commands
    end with the fatal one), or its exit status."""
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {result.returncode}"


def job_state(job_id: str) -> str | None:
    """PENDING, RUNNING, REQUEUED, COMPLETED, FAILED, ... (None once Slurm has forgotten it)."""
    result = _run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    state = result.stdout.strip()
    if result.returncode == 0 and state:
        return state.splitlines()[0]
    result = _run(["scontrol", "-o", "show", "job", job_id])
    if result.returncode != 0 and "invalid job id" not in result.stderr.lower():
        # the controller down, not a job it forgot: say so rather than "no state"
        raise SchedulerError(f"scontrol show job {job_id}: {_said(result)}")
    for field in result.stdout.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return None


def cancel(job_id: str) -> None:
    result = _run(["scancel", job_id])
    if result.returncode != 0:
        raise SchedulerError(f"scancel {job_id}: {_said(result)}")


def node_memory_mib(partition: str = "") -> int:
    """The smallest RealMemory (MiB) of the partition's nodes (every node's without one): what
    `--mem=0` gives a job on a whole node. A SchedulerError when Slurm does not say."""
    command = ["sinfo", "-h", "-N", "-o", "%m", *(["-p", partition] if partition else [])]
    result = _run(command, timeout_s=10)
    if result.returncode != 0:
        raise SchedulerError(f"{' '.join(command)}: {_said(result)}")
    sizes = [int(line.strip().rstrip("+")) for line in result.stdout.split() if line.strip()]
    if not sizes:
        raise SchedulerError(f"{' '.join(command)}: no node listed")
    return min(sizes)
