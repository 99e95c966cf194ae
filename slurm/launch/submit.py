"""From an experiment to a Slurm job, through submitit: the executor's parameters and the
`python` command are pure functions of the config (golden-tested, printed by --dry-run), and
submitit renders the sbatch script and submits it.

The job runs one task per node (`srun --kill-on-bad-exit=1`: a node that exits non-zero ends
the others), each task `python -u -m submitit.core._submit FOLDER` with `python` either the
interpreter that submitted (a virtual environment on shared storage) or, with an image,
`apptainer exec --nv --bind RUN --bind /dev/shm --env ... IMAGE python3`, so every task runs
inside the image. The submitit folder is RUN/submitit/%j: the pickled job (the resolved config,
no secret), the sbatch script and each task's raw log. Slurm's warning before the time limit is
SIGURG and submitit's requeue is made by the batch script once every node has stopped
(slurm/requeue.py: what a job inside an image needs).
"""

from __future__ import annotations

import contextlib
import io
import shlex
from typing import Any

from slurm import requeue
from slurm.config import ExperimentConfig
from slurm.launch.scheduler import SchedulerError
from slurm.launch.task_command import python_command, srun_cpus, submitit_folder

# srun's own option: when any task exits non-zero, end the others (fail fast, no stragglers)
SRUN_ARGS = ("--kill-on-bad-exit=1",)


def executor_parameters(config: ExperimentConfig) -> dict[str, Any]:
    """The parameters of submitit's SlurmExecutor (its names: sbatch's, with underscores)."""
    slurm = config.slurm
    run = config.run_folder
    parameters: dict[str, Any] = {
        "job_name": config.run.name,
        "nodes": slurm.nodes,
        "ntasks_per_node": 1,
        "time": slurm.time_min,
        "signal_delay_s": slurm.signal_delay_s,
        "srun_args": [*SRUN_ARGS, *srun_cpus(config)],
    }
    optional = {
        "gpus_per_node": slurm.gpus_per_node,
        "cpus_per_task": slurm.cpus_per_task,
        "mem": memory(slurm.mem_gb, slurm.exclusive),
        "partition": slurm.partition,
        "account": slurm.account,
        "qos": slurm.qos,
        "constraint": slurm.constraint,
        "exclusive": slurm.exclusive or None,
        "setup": [*slurm.setup, *requeue.batch_setup(run)],
        "teardown": requeue.batch_teardown(run),
        # a requeue (ours on the warning signal, or Slurm's on preemption) must not depend on
        # the site's JobRequeue default; the warning is SIGURG, by number (slurm/requeue.py)
        "additional_parameters": {
            "requeue": True,
            "signal": requeue.sbatch_signal(slurm.signal_delay_s),
            **slurm.extra,
        },
    }
    parameters.update({key: value for key, value in optional.items() if value})
    return parameters


def memory(mem_gb: float, exclusive: bool) -> str | None:
    """sbatch's --mem per node: the amount asked for; with `mem_gb = 0` on exclusive nodes the
    whole node's memory ("0": --exclusive alone leaves the job the partition's default per
    CPU); on shared nodes the partition's default (None: no --mem)."""
    if mem_gb:
        return f"{round(mem_gb * 1024)}MB"
    return "0" if exclusive else None


def sbatch_script(config: ExperimentConfig, parameters: dict[str, Any] | None = None) -> str:
    """The batch script submitit would submit for this config (the training job's
    parameters, or others: a conversion job's), rendered by submitit itself."""
    from submitit.slurm.slurm import _make_sbatch_string

    folder = submitit_folder(config)
    command = " ".join(
        [python_command(config), "-u -m submitit.core._submit", shlex.quote(str(folder))]
    )
    parameters = parameters or executor_parameters(config)
    script: str = _make_sbatch_string(command=command, folder=folder, **parameters)
    return script


class SubmissionRefused(SchedulerError):
    """sbatch refused the job (an unknown partition, a limit of the account, ...)."""

    code = "submission_refused"


def submit(config: ExperimentConfig) -> str:
    """Submit the job (sbatch, through submitit); its id. Raises `SubmissionRefused` with
    Slurm's own reason when sbatch refuses it."""
    import submitit
    from submitit.core.utils import FailedJobError

    from slurm.bootstrap import NodeJob

    executor = submitit.SlurmExecutor(
        folder=submitit_folder(config),
        max_num_timeout=config.slurm.max_requeues,
        python=python_command(config),
    )
    executor.update_parameters(**executor_parameters(config))
    printed = io.StringIO()
    try:
        requeue.write_stand_in(config.run_folder)
        with contextlib.redirect_stderr(printed):  # submitit prints sbatch's stderr, then raises
            job = executor.submit(NodeJob(config))
    except FailedJobError as error:
        raise SubmissionRefused(f"sbatch refused the job: {slurm_reason(str(error))}") from None
    return str(job.job_id)


def slurm_reason(stderr: str) -> str:
    """sbatch's own words, without its prefix: the last line that says something."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if not lines:
        return "no reason given (sbatch exited non-zero)"
    return lines[-1].removeprefix("sbatch: error: ").removeprefix("sbatch: ")
