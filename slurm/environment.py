"""The only reader of the job's environment: who this node is inside a Slurm job.

submitit's JobEnvironment parses the variables it knows (job id, node rank, node count, the
node list); the few it does not (the requeue count, the node's Slurm name, the CPUs given to
the task) are read here too, so no other module ever names a SLURM_* variable.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeInfo:
    """One task of the job (the job runs one task per node)."""

    job_id: str
    node: int  # 0 .. num_nodes - 1; node 0 runs the Ray head and the trainer
    num_nodes: int
    hostname: str
    node_name: str  # Slurm's name for the node; emulated nodes on one host share a hostname
    restart_count: int  # 0 on the first attempt, +1 after each requeue
    cpus: int  # CPUs Slurm gave this task

    @property
    def is_head(self) -> bool:
        return self.node == 0

    @property
    def attempt(self) -> str:
        """A name for this attempt of the job, unique within its run folder."""
        return f"{self.job_id}-{self.restart_count}"


def current_node() -> NodeInfo:
    """This task's NodeInfo; only valid inside a submitit job."""
    import submitit

    job = submitit.JobEnvironment()
    return NodeInfo(
        job_id=job.job_id,
        node=job.node,
        num_nodes=job.num_nodes,
        hostname=job.hostname,
        node_name=os.environ.get("SLURMD_NODENAME", "") or socket.gethostname(),
        restart_count=_int(os.environ.get("SLURM_RESTART_COUNT"), 0),
        cpus=_int(os.environ.get("SLURM_CPUS_PER_TASK"), 0)
        or _int(os.environ.get("SLURM_CPUS_ON_NODE"), 0)
        or (os.cpu_count() or 1),
    )


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text else default
    except ValueError:
        return default
