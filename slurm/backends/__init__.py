"""Training backends: what node 0 trains with, behind one seam the launcher calls.

A backend says what data must exist before the services start (`prepare`, on node 0), which
services every node runs for it (`services`), the command node 0 runs to train (`command`, the
job's exit code is that command's) and what a new attempt resumes from (`resume_point`).
`local` is the CPU GRPO of `deepdive run`, spread over the job's nodes through Ray; `slime`
(slime's train.py) plugs in here next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from slurm.config import ExperimentConfig
from slurm.run_folder import AttemptFolder


@dataclass(frozen=True)
class ServiceSpec:
    """One service every node runs: its name (also its port's name in the port plan) and its
    `python -m services` arguments, without host and port."""

    name: str
    arguments: tuple[str, ...]


class Backend(Protocol):
    name: str

    def prepare(self) -> dict[str, Any]:
        """Node 0, before any service starts: write what the services read; a summary."""
        ...

    def services(self) -> list[ServiceSpec]: ...

    def command(self, attempt: AttemptFolder) -> list[str]:
        """The training command line node 0 runs (a pure function of the config)."""
        ...

    def resume_point(self) -> str | None:
        """What the next attempt continues from, in words (None: it starts afresh)."""
        ...


def build_backend(config: ExperimentConfig) -> Backend:
    from slurm.backends.local import LocalBackend

    return LocalBackend(config)
