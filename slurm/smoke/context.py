"""What every step is handed: the experiment, this node, the kit's folder on storage every
node sees, the model for the SGLang and slime steps; and the notes nodes leave each other
there (the run folder's way: a file written whole, read by the others)."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.base.waiting import WaitTimeout, wait_for
from slurm.config import ExperimentConfig
from slurm.node.environment import NodeInfo
from slurm.node.ports import NodePorts, plan_node_ports
from slurm.run_folder import read_json, write_json


class NoAnswer(WaitTimeout):
    """Another node did not leave the note a step waits for."""

    code = "smoke_no_answer"


@dataclass(frozen=True)
class SmokeContext:
    config: ExperimentConfig
    node: NodeInfo
    folder: Path  # the kit's folder: notes, each step's logs, the report
    model: str = ""  # a Hugging Face folder (steps 4 and 5): Qwen2.5-0.5B-Instruct
    tp: int = 2  # SGLang's tensor parallelism in step 4
    python: str = field(default_factory=lambda: sys.executable)

    @property
    def num_nodes(self) -> int:
        return self.node.num_nodes

    def step_folder(self, name: str) -> Path:
        path = self.folder / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def note(self, name: str) -> Path:
        return self.folder / "notes" / f"{name}.json"

    def publish(self, name: str, value: dict[str, Any]) -> None:
        write_json(self.note(name), value)

    def await_note(self, name: str, what: str, timeout_s: float) -> dict[str, Any]:
        path = self.note(name)

        def probe() -> dict[str, Any] | None:
            value = read_json(path)
            return value if isinstance(value, dict) else None

        try:
            return wait_for(probe, timeout_s=timeout_s, what=what, max_delay_s=1.0)
        except WaitTimeout:
            raise NoAnswer(f"{what}: no answer after {timeout_s:g} s ({path})") from None

    def ports(self) -> NodePorts:
        """A block of this node's ports, free now, below the ephemeral range (the port plan's):
        a client that retries against a port there can never be handed it as its own source
        port and connect to itself, as one can on a free port taken from the ephemeral range."""
        ports, _ = plan_node_ports(self.node.job_id, self.node.node, self.num_nodes)
        return ports

    def await_nodes(self, key: str, what: str, timeout_s: float) -> list[dict[str, Any]]:
        """Every node's note `key.node-K`, in node order."""
        return [
            self.await_note(f"{key}.node-{node}", f"{what} from node {node}", timeout_s)
            for node in range(self.num_nodes)
        ]


def here(config: ExperimentConfig, folder: Path, model: str = "", tp: int = 2) -> SmokeContext:
    """A context for this machine alone: one node, outside Slurm."""
    node = NodeInfo(
        job_id=f"here{os.getpid()}",
        node=0,
        num_nodes=1,
        hostname=socket.gethostname(),
        node_name=socket.gethostname(),
        restart_count=0,
        cpus=len(os.sched_getaffinity(0)),
    )
    return SmokeContext(config, node, folder, model, tp)
