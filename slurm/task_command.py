"""How every task of a job starts: the Python it runs (submitit's `python` override: the
submitting interpreter, or `apptainer exec ... IMAGE python3`) and the submitit folder it
reads its pickle from. The training job, a conversion and the GPU smoke job share them; apart
from slurm/submit.py so those jobs need nothing of the training job's submission."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from slurm import requeue
from slurm.config import ExperimentConfig
from slurm.run_folder import RunFolder


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
    parts += requeue.container_environment(RunFolder(Path(config.run.folder)))
    parts += [*container.options, container.image, container.python]
    return shlex.join(parts)


def submitit_folder(config: ExperimentConfig) -> Path:
    return RunFolder(Path(config.run.folder)).submitit / "%j"
