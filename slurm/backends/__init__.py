"""Training backends: what node 0 trains with, behind one seam the launcher calls.

A backend says what data must exist before the services start (`prepare`, on node 0), which
services every node runs for it (`services`), the command node 0 runs to train (`command`, the
job's exit code is that command's) and what a new attempt resumes from (`resume_point`).
`local` is the CPU GRPO of `deepdive run`, spread over the job's nodes through Ray; `slime`
is slime's train.py with our hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from services.serving.workers import default_workers
from slurm.config import ExperimentConfig
from slurm.run_folder import AttemptFolder


@dataclass(frozen=True)
class ServiceSpec:
    """One service every node runs: its name (also its port's name in the port plan) and its
    `python -m services` arguments, without host and port. `workers`: None for a service of
    one process; a tool server's worker processes (`--workers`), 0 for one per core of the
    node's task (`services.tool_workers`' default)."""

    name: str
    arguments: tuple[str, ...]
    workers: int | None = None

    def worker_count(self, cores: int | None) -> int:
        """Its processes on a node with `cores` CPUs (None: this process's affinity)."""
        if self.workers is None:
            return 1
        return self.workers or default_workers(cores)

    def command_arguments(self, cores: int | None) -> list[str]:
        """Its `python -m services` arguments, with `--workers` where it takes one."""
        if self.workers is None:
            return list(self.arguments)
        return [*self.arguments, "--workers", str(self.worker_count(cores))]


class Backend(Protocol):
    name: str
    # whether node 0 starts the trainer with its Ray and services, before any is up (it then
    # waits for node 0's ready note before it connects to Ray, and for cluster.json), or only
    # once every node is ready
    starts_early: bool

    def prepare(self) -> dict[str, Any]:
        """Node 0, before any service starts: write what the services read; a summary."""
        ...

    def services(self) -> list[ServiceSpec]: ...

    def environment(self, node_ip: str) -> dict[str, str]:
        """What every node's Ray (so every actor) and the trainer need in their environment."""
        ...

    def before_training(self, attempt: AttemptFolder, services: dict[str, str]) -> None:
        """Node 0, every node ready: write what the trainer reads (`services`: node 0's URLs)."""
        ...

    def command(self, attempt: AttemptFolder) -> list[str]:
        """The training command line node 0 runs (a pure function of the config)."""
        ...

    def working_directory(self) -> str | None: ...

    def resume_point(self) -> str | None:
        """What the next attempt continues from, in words (None: it starts afresh)."""
        ...

    def describe(self, attempt: AttemptFolder) -> str:
        """The training command as --dry-run prints it."""
        ...


def build_backend(config: ExperimentConfig) -> Backend:
    if config.run.backend == "slime":
        from slurm.backends.slime import SlimeBackend

        return SlimeBackend(config)
    from slurm.backends.local import LocalBackend

    return LocalBackend(config)
