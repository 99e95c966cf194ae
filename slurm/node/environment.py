"""The only reader of the job's environment: who this node is inside a Slurm job.

submitit's JobEnvironment parses the variables it knows (job id, node rank, node count, the
node list); the few it does not (the requeue count, the node's Slurm name, the CPUs and GPUs
given to the task) are read here too, so no other module ever names a SLURM_* variable. A
task's CPUs are also read from its affinity mask: what it may really run on.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

# The two variables an attempt's name comes from (NodeInfo.attempt), also read by the shell
# scripts of slurm/requeue.py: "$JOB-${RESTART:-0}"
JOB_ID_VARIABLE = "SLURM_JOB_ID"
RESTART_COUNT_VARIABLE = "SLURM_RESTART_COUNT"


@dataclass(frozen=True)
class NodeInfo:
    """One task of the job (the job runs one task per node)."""

    job_id: str
    node: int  # 0 .. num_nodes - 1; node 0 runs the Ray head and the trainer
    num_nodes: int
    hostname: str
    node_name: str  # Slurm's name for the node; emulated nodes on one host share a hostname
    restart_count: int  # 0 on the first attempt, +1 after each requeue
    cpus: int  # CPUs this task's stack is sized to (Ray, the tool workers): CpuGrant.usable
    cpu_grant: CpuGrant | None = None  # where `cpus` came from (None: made by hand, in tests)

    @property
    def is_head(self) -> bool:
        return self.node == 0

    @property
    def attempt(self) -> str:
        """A name for this attempt of the job, unique within its run folder."""
        return f"{self.job_id}-{self.restart_count}"


@dataclass(frozen=True)
class CpuGrant:
    """The CPUs Slurm says this task has, beside the CPUs it may really run on.

    Slurm 22.05 to 23.02's srun does not read SLURM_CPUS_PER_TASK from the batch job: a step
    started without --cpus-per-task has one CPU per task, and with core binding (task/affinity,
    task/cgroup) its task runs on one core while the variable still says what sbatch got. The
    affinity mask is what the kernel lets the task use, so the stack is sized from it; on
    task/none it is every CPU of the host, so Slurm's count bounds it (the others are another
    job's)."""

    slurm: int  # SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE; 0 = neither says
    affinity: int  # len(os.sched_getaffinity(0))

    @property
    def usable(self) -> int:
        return min(self.affinity, self.slurm) if self.slurm else self.affinity

    @property
    def differs(self) -> bool:
        return bool(self.slurm) and self.slurm != self.affinity

    def describe(self) -> str:
        if not self.slurm:
            return f"{self.affinity} CPU(s) in this task's affinity; Slurm names no CPU count"
        if self.affinity < self.slurm:
            return (
                f"Slurm gave this task {self.slurm} CPU(s) but its affinity holds "
                f"{self.affinity}: srun was started without --cpus-per-task (Slurm 22.05 to "
                f"23.02 do not pass sbatch's on) under core binding; sized to {self.usable}"
            )
        if self.affinity > self.slurm:
            return (
                f"Slurm gave this task {self.slurm} CPU(s); its affinity holds {self.affinity} "
                f"(nothing binds tasks to their CPUs: task/none); sized to {self.usable}"
            )
        return f"{self.slurm} CPU(s), as Slurm gave them"


def cpus_given(environ: Mapping[str, str] | None = None) -> CpuGrant:
    """This task's CPUs, as Slurm's variables say and as its affinity mask allows."""
    environ = os.environ if environ is None else environ
    slurm = _int(environ.get("SLURM_CPUS_PER_TASK"), 0) or _int(
        environ.get("SLURM_CPUS_ON_NODE"), 0
    )
    return CpuGrant(slurm=slurm, affinity=len(os.sched_getaffinity(0)))


def current_node() -> NodeInfo:
    """This task's NodeInfo; only valid inside a submitit job."""
    import submitit

    job = submitit.JobEnvironment()
    grant = cpus_given()
    return NodeInfo(
        job_id=job.job_id,
        node=job.node,
        num_nodes=job.num_nodes,
        hostname=job.hostname,
        node_name=os.environ.get("SLURMD_NODENAME", "") or socket.gethostname(),
        restart_count=_int(os.environ.get(RESTART_COUNT_VARIABLE), 0),
        cpus=grant.usable,
        cpu_grant=grant,
    )


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default


@dataclass(frozen=True)
class GpuGrant:
    """The GPUs Slurm gave this task, as its variables say (None where one is unset): what the
    GPU smoke kit compares with what torch sees."""

    in_job: bool
    gpus_on_node: str | None
    job_gpus: str | None
    visible_devices: str | None

    @property
    def count(self) -> int | None:
        """How many GPUs this task was given; None when no variable says."""
        if self.gpus_on_node is not None and self.gpus_on_node.strip().isdigit():
            return int(self.gpus_on_node)
        for listed in (self.job_gpus, self.visible_devices):
            if listed is None:
                continue
            items = [item for item in listed.split(",") if item.strip()]
            # Slurm sets "NoDevFiles" for a job without GPUs on a node that has some
            return 0 if items in ([], ["NoDevFiles"], ["-1"]) else len(items)
        return None

    def describe(self) -> str:
        shown = {
            "SLURM_GPUS_ON_NODE": self.gpus_on_node,
            "SLURM_JOB_GPUS": self.job_gpus,
            "CUDA_VISIBLE_DEVICES": self.visible_devices,
        }
        given = ", ".join(f"{name}={value}" for name, value in shown.items() if value is not None)
        if given:
            return given
        if self.in_job:
            return "this Slurm job asked for no GPU (SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS unset)"
        return "not in a Slurm job, CUDA_VISIBLE_DEVICES unset"


def gpus_given(environ: Mapping[str, str] | None = None) -> GpuGrant:
    """The GPU part of this task's environment (`environ`: os.environ unless given)."""
    environ = os.environ if environ is None else environ
    return GpuGrant(
        in_job="SLURM_JOB_ID" in environ,
        gpus_on_node=environ.get("SLURM_GPUS_ON_NODE"),
        job_gpus=environ.get("SLURM_JOB_GPUS"),
        visible_devices=environ.get("CUDA_VISIBLE_DEVICES"),
    )
