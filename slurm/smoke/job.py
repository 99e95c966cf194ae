"""The kit as one Slurm job through the launcher: the training job's executor parameters
(its nodes, GPUs, partition, account) and its `python` (submitit's override: the image's
`apptainer exec --nv ... python3` when [container] image is set), one task per node, each
running the chosen steps with the others (slurm.smoke.runner). The kit writes into
RUN/smoke/JOB; node 0's report is RUN/smoke/JOB/report.txt (and .json)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

from services.base.errors import RuntimeFailure
from slurm.config import ExperimentConfig
from slurm.launch.submit import executor_parameters as training_parameters
from slurm.launch.task_command import python_command, submitit_folder
from slurm.node.environment import current_node
from slurm.run_folder import private_folder, read_json
from slurm.smoke.context import SmokeContext
from slurm.smoke.report import verdict
from slurm.smoke.runner import run_node
from slurm.smoke.steps import Step, select

MARGIN_MIN = 10  # the job's time limit: every chosen step's deadline, and this
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


class SmokeFailed(RuntimeFailure):
    code = "smoke_failed"


def smoke_folder(config: ExperimentConfig, job_id: str) -> Path:
    return config.run_folder.root / "smoke" / job_id


class SmokeJob:
    """What each node of the kit's job runs (submitit pickles it: the resolved experiment and
    the kit's choices, no secret)."""

    def __init__(
        self, config: ExperimentConfig, steps: str, model: str, tp: int, keep_going: bool
    ) -> None:
        self.config = config
        self.steps = steps
        self.model = model
        self.tp = tp
        self.keep_going = keep_going

    def __call__(self) -> int:
        node = current_node()
        folder = smoke_folder(self.config, node.job_id)
        folder.mkdir(parents=True, exist_ok=True)
        context = SmokeContext(self.config, node, folder, self.model, self.tp)
        results = run_node(select(self.steps), context, self.keep_going)
        sys.stdout.flush()
        if not verdict(results):
            sys.exit(1)  # the job's state says it: FAILED
        return 0


def executor_parameters(config: ExperimentConfig, steps: list[Step]) -> dict[str, Any]:
    """The training job's parameters, named for the kit, with a time limit that covers every
    chosen step's deadline."""
    parameters = training_parameters(config)
    parameters["job_name"] = f"{config.run.name}-smoke"
    parameters["time"] = math.ceil(sum(step.timeout_s for step in steps) / 60) + MARGIN_MIN
    return parameters


def submit(config: ExperimentConfig, job: SmokeJob, steps: list[Step]) -> str:
    import submitit

    run = config.run_folder
    private_folder(run.root)
    private_folder(run.submitit)
    executor = submitit.SlurmExecutor(
        folder=submitit_folder(config), max_num_timeout=0, python=python_command(config)
    )
    executor.update_parameters(**executor_parameters(config, steps))
    return str(executor.submit(job).job_id)


def wait_for_report(config: ExperimentConfig, job_id: str, poll_s: float = 5.0) -> str:
    """Block until the job's report is written (its text) or the job ends without one."""
    from slurm.launch.scheduler import job_state

    folder = smoke_folder(config, job_id)
    while True:
        report = read_json(folder / "report.json")
        if isinstance(report, dict):
            text = (folder / "report.txt").read_text()
            if not report.get("ok"):
                raise SmokeFailed(f"job {job_id} failed; its report ({folder}/report.txt):\n{text}")
            return text
        state = job_state(job_id)
        if state is None or state in ENDED:
            logs = config.run_folder.submitit / job_id
            raise SmokeFailed(
                f"job {job_id} ended ({state or 'gone from the queue'}) without a report: "
                f"see its logs in {logs}"
            )
        time.sleep(poll_s)
