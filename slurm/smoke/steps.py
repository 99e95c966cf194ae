"""The kit's steps, in the order they run, and `--only`'s choice among them.

A step names its function as "module:function" (run in the step's own process, so the list
itself imports nothing heavy), what it checks, how long it takes on a healthy node, how long
it may take before it is stopped as hung, and whether every node runs it or node 0 alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.base.errors import ConfigError

Scope = Literal["every node", "node 0"]


@dataclass(frozen=True)
class Step:
    number: int
    name: str
    title: str
    expected: str  # on a healthy node, in words: "about 30 s"
    timeout_s: float  # the step's process is stopped (and the step fails) after this long
    scope: Scope
    function: str  # "module:function", called with the SmokeContext; returns its checks
    needs_model: bool = False

    def line(self) -> str:
        return f"{self.number} {self.name:<7} {self.expected:<13} {self.scope:<11} {self.title}"


STEPS = (
    Step(
        1,
        "image",
        "the image as a normal user: driver, GPUs Slurm gave = GPUs torch sees, "
        "slime's import closure and our hooks, files readable, a real search",
        "about 30 s",
        300,
        "every node",
        "slurm.smoke.image:run",
    ),
    Step(
        2,
        "nccl",
        "NCCL all-reduce on each node's GPUs and across nodes (bus bandwidth, transport "
        "from NCCL's log), gloo over the chosen interface",
        "about 2 min",
        900,
        "every node",
        "slurm.smoke.collective:run",
    ),
    Step(
        3,
        "ray",
        "the bootstrap on every node: Ray sees each node's GPUs and deepdive_node_K, GPU "
        "actors with their own runtime envs start",
        "about 3 min",
        1200,
        "every node",
        "slurm.smoke.ray_step:run",
    ),
    Step(
        4,
        "sglang",
        "SGLang with TP behind the router: generate, memory release and resume, a weight "
        "update from tensor",
        "about 5 min",
        1800,
        "node 0",
        "slurm.smoke.sglang_step:run",
        needs_model=True,
    ),
    Step(
        5,
        "slime",
        "a 10-minute slime run of a 0.5B Qwen with our hooks and the offline world, then a "
        "to-hf / to-megatron round trip of its checkpoint",
        "about 25 min",
        4200,
        "node 0",
        "slurm.smoke.slime_step:run",
        needs_model=True,
    ),
    Step(
        6,
        "local",
        "one step of the local backend (warm start, GRPO) on the GPU",
        "about 1 min",
        900,
        "node 0",
        "slurm.smoke.local_step:run",
    ),
)


def select(spec: str, steps: tuple[Step, ...] = STEPS) -> list[Step]:
    """The steps `spec` names ("2", "image,local", "1,6"; "" or "all": every step), in the
    kit's order whatever the order named."""
    if spec.strip() in ("", "all"):
        return list(steps)
    wanted = set()
    for item in spec.split(","):
        item = item.strip()
        found = [step for step in steps if item in (str(step.number), step.name)]
        if not found:
            names = ", ".join(f"{step.number} or {step.name}" for step in steps)
            raise ConfigError(f"--only: no step {item!r} (the steps: {names})")
        wanted.add(found[0].number)
    return [step for step in steps if step.number in wanted]


def plan(steps: list[Step]) -> str:
    """The steps about to run, with their expected runtimes."""
    lines = [f"{'#':<1} {'step':<7} {'expected':<13} {'runs on':<11} what it checks"]
    lines += [step.line() for step in steps]
    return "\n".join(lines)
