"""Step 3: the project's own bootstrap (slurm.bootstrap.NodeBootstrap) on every node of the
job, with the experiment's backend for everything but the trainer: the same storage probe,
port plan, Ray head and workers with the backend's environment, services and join. Node 0's
trainer is the probe (slurm.smoke.ray_probe): Ray sees every node's GPUs and deepdive_node_K,
and GPU actors with their own runtime envs start on every node.

The `[services]` tool server (what slime's backend serves) reads a small offline world here
(node 0 writes it before any service starts, as a backend's data), so the step needs no key
and no network; a backend that serves its own world (local) leaves it unread.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from slurm.backends import Backend, EvalEngine, ServiceSpec
from slurm.bootstrap import NodeBootstrap
from slurm.config import ExperimentConfig, ServiceTable
from slurm.node.environment import NodeInfo
from slurm.run_folder import AttemptFolder, read_json
from slurm.smoke import world
from slurm.smoke.context import SmokeContext
from slurm.smoke.report import Check, failed, passed

ACTOR_TIMEOUT_S = 300.0


class ProbeBackend:
    """The experiment's backend, with a probe in place of its trainer."""

    name = "smoke"
    starts_early = False  # the probe starts once every node is ready

    def __init__(self, delegate: Backend, command: list[str], world_folder: Path | None) -> None:
        self.delegate = delegate
        self.probe = command
        self.world_folder = world_folder

    def check(self) -> list[str]:
        return self.delegate.check()

    def check_continues(self, saved: ExperimentConfig) -> None:
        self.delegate.check_continues(saved)

    def missing_inputs(self) -> list[str]:
        return self.delegate.missing_inputs()

    def input_paths(self) -> dict[str, str]:
        return self.delegate.input_paths()

    def eval_engine(self) -> EvalEngine:
        return self.delegate.eval_engine()

    def prepare(self) -> dict[str, Any]:
        if self.world_folder is not None:
            world.write(self.world_folder)
        return self.delegate.prepare()

    def services(self) -> list[ServiceSpec]:
        return self.delegate.services()

    def environment(self, node_ip: str) -> dict[str, str]:
        return self.delegate.environment(node_ip)

    def before_training(self, attempt: AttemptFolder) -> None:
        return None

    def command(self, attempt: AttemptFolder) -> list[str]:
        return list(self.probe)

    def while_training(self) -> None:
        return None  # the probe keeps no checkpoint

    def checkpoint_step(self) -> int | None:
        return None

    def working_directory(self) -> str | None:
        return None

    def resume_point(self) -> str | None:
        return None

    def describe(self, attempt: AttemptFolder) -> str:
        return " ".join(self.probe)


class ProbeBootstrap(NodeBootstrap):
    """NodeBootstrap as it is, its backend wrapped by ProbeBackend."""

    def __init__(
        self, config: ExperimentConfig, node: NodeInfo, probe: list[str], world: Path | None
    ) -> None:
        super().__init__(config, node)
        self.backend = ProbeBackend(self.backend, probe, world)


def step_config(config: ExperimentConfig, folder: Path, tools: ServiceTable) -> ExperimentConfig:
    """The experiment with its run folder in the kit's folder and `[services.tools]` over the
    kit's world."""
    run = dataclasses.replace(config.run, name=f"{config.run.name}-smoke", folder=str(folder))
    services = dataclasses.replace(config.services, tools=tools)
    return dataclasses.replace(config, run=run, services=services)


def probe_command(context: SmokeContext, result: Path) -> list[str]:
    return [
        context.python, "-m", "slurm.smoke.ray_probe",
        "--nodes", str(context.num_nodes),
        "--gpus-per-node", str(context.config.slurm.gpus_per_node),
        "--timeout-s", f"{ACTOR_TIMEOUT_S:g}",
        "--result", str(result),
    ]  # fmt: skip


def bootstrap_checks(
    config: ExperimentConfig, node: NodeInfo, code: int, trainer: str = "the trainer"
) -> list[Check]:
    """What the bootstrap's notes say about this node's run of it: a failure of any node, by
    name and phase, or this node's part done (`code` 0; on node 0, the trainer's code)."""
    attempt = config.run_folder.attempt(node.attempt)
    failures = attempt.failures()
    checks = [
        failed(
            f"bootstrap on node {note.get('node')}",
            f"failed during {note.get('phase')}: {note.get('error')}",
        )
        for note in failures
    ]
    if checks:
        return checks
    log = attempt.node_log(node.node)
    if code != 0:
        return [failed(f"bootstrap on node {node.node}", f"exited with status {code} ({log})")]
    part = f"started Ray and the services, ran {trainer}" if node.is_head else "joined, served"
    return [passed(f"bootstrap on node {node.node}", f"{part} ({log})")]


def run(context: SmokeContext) -> list[Check]:
    folder = context.step_folder("3-ray") / "run"
    world_folder = folder / "world"
    tools = world.SmokeWorld(world_folder).tools_table()
    config = step_config(context.config, folder, tools)
    result = folder / "probe.json"
    node = context.node
    code = ProbeBootstrap(config, node, probe_command(context, result), world_folder).run()
    if not node.is_head:
        return bootstrap_checks(config, node, code)
    probe = read_json(result)
    if not isinstance(probe, dict):  # the probe's own exit code is its verdict, not the bootstrap's
        return [
            *bootstrap_checks(config, node, code, "the probe"),
            failed("probe", f"wrote no result ({result}); see the node's log"),
        ]
    checks = bootstrap_checks(config, node, 0, "the probe")
    checks += [Check(**check) for check in probe["checks"]]
    if context.num_nodes < 2:
        checks.append(
            failed(
                "across nodes",
                "not checked: this run has 1 node; run the kit as a Slurm job of 2 nodes or "
                "more (deepdive smoke EXPERIMENT --nodes 2)",
            )
        )
    return checks
