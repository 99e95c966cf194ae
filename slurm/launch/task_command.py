"""How every task of a job starts: the Python it runs (submitit's `python` override: the
submitting interpreter, or `apptainer exec ... IMAGE python3`), the CPUs srun gives it, and
the submitit folder it reads its pickle from. The training job, a conversion and the GPU smoke job share them; apart
from slurm/launch/submit.py so those jobs need nothing of the training job's submission."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from slurm import requeue
from slurm.config import ExperimentConfig


def python_command(config: ExperimentConfig) -> str:
    """The shell command each task starts Python with (submitit's `python` override). Inside an
    image the tasks get the warning signal's name and the stand-in scontrol with --env, first
    on the image's own PATH (slurm/requeue.py)."""
    container = config.container
    if not container.image:
        return shlex.quote(sys.executable)
    binds = [config.run.folder, "/dev/shm", *container.binds]  # noqa: S108 (the host's shm)
    parts = [container.apptainer, "exec"]
    if container.nv:
        parts.append("--nv")
    for bind in binds:
        parts += ["--bind", bind]
    parts += requeue.container_environment(config.run_folder)
    parts += [*container.options, container.image, container.python]
    return shlex.join(parts)


def srun_cpus(config: ExperimentConfig) -> list[str]:
    """srun's --cpus-per-task, the job's own: Slurm 22.05 to 23.02's srun does not take
    sbatch's from the batch job's environment, so a step without it gets one CPU per task, and under core
    binding (task/affinity, task/cgroup) the node's whole stack runs on one core. Every srun
    version takes the option; none when the job leaves the count to the cluster."""
    cpus = config.slurm.cpus_per_task
    return [f"--cpus-per-task={cpus}"] if cpus else []


def submitit_folder(config: ExperimentConfig) -> Path:
    return config.run_folder.submitit / "%j"
