"""`backend = "local"` on a Slurm job: the CPU GRPO of `deepdive run`, with one rollout worker
per node.

Node 0 writes the offline world into the run folder before any service starts; every node
serves that world's pages (tool server, offline search and reader) and the rule judge (reward
server); node 0 then runs the trainer (`python -m slurm.backends.local_main`), which connects
to the job's Ray cluster and places one rollout worker on each node, each calling its own
node's services. A new attempt resumes from the newest complete checkpoint in the run folder
by itself (deepdive.local.paths.resume_point).
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from pathlib import Path
from typing import Any

from deepdive.local.paths import resume_point
from deepdive.local.stack import offline_tools_config
from slurm.backends import EvalEngine, ServiceSpec
from slurm.config import ExperimentConfig, local_run_config
from slurm.run_folder import AttemptFolder

TRAINER_MODULE = "slurm.backends.local_main"


class LocalBackend:
    name = "local"
    starts_early = True  # its trainer builds the policy while the nodes join

    def __init__(self, config: ExperimentConfig) -> None:
        self.experiment = config
        self.config = local_run_config(config)
        self.paths = config.run_folder  # RunPaths at run.folder, the local run's run.out

    def check(self) -> list[str]:
        return []  # the [local.*] tables check themselves as they load

    def check_continues(self, saved: ExperimentConfig) -> None:
        """The run folder's newest checkpoint holds its config; resuming refuses another run
        (deepdive.local.paths.resume_point)."""
        resume_point(self.config, dataclasses.asdict(self.config), self.paths)

    def missing_inputs(self) -> list[str]:
        return []  # node 0 writes its world, data and model into the run folder

    def input_paths(self) -> dict[str, str]:
        path = self.experiment.local.model.path  # a model to start from, else one built here
        return {"local.model.path": str(Path(path).expanduser().absolute())} if path else {}

    def eval_engine(self) -> EvalEngine:
        from slurm.backends.local_eval import LocalEvalEngine

        return LocalEvalEngine(self.experiment)

    def prepare(self) -> dict[str, Any]:
        # imported here, as resume_point's: every node builds its backend before its Ray
        # starts, and these bring numpy and the search index's library (a second of a loaded
        # node's start); only node 0 prepares, once its Ray is launched
        from deepdive.local.data import prepare_data

        return prepare_data(self.config, self.paths)

    def services(self) -> list[ServiceSpec]:
        services = self.experiment.services
        level = services.log_level
        tools = offline_tools_config(self.paths.world)
        specs = [
            ServiceSpec("tools", "tools", tools, services.tool_workers, level),
            ServiceSpec("reward", "reward", {"judge": "rule"}, log_level=level),
        ]
        if self.config.eval.unseen_questions:  # a few held-out questions: one process
            unseen = offline_tools_config(self.paths.unseen_world)
            specs.append(ServiceSpec("tools-unseen", "tools", unseen, 1, level))
        return specs

    def command(self, attempt: AttemptFolder) -> list[str]:
        container = self.experiment.container
        return [
            container.python if container.image else sys.executable,  # as the node runs it
            "-m",
            TRAINER_MODULE,
            str(self.paths.root),
            "--cluster",
            str(attempt.cluster),
            "--phases",
            str(attempt.phases(0)),
        ]

    def environment(self, node_ip: str) -> dict[str, str]:
        return {}

    def before_training(self, attempt: AttemptFolder) -> None:
        return None  # the trainer reads cluster.json

    def while_training(self) -> None:
        return None  # the trainer keeps its own checkpoints ([local.checkpoint] keep)

    def working_directory(self) -> str | None:
        return None

    def describe(self, attempt: AttemptFolder) -> str:
        return shlex.join(self.command(attempt))

    def checkpoint_step(self) -> int | None:
        from deepdive.local.checkpoint import newest_step

        return newest_step(self.paths.checkpoints)

    def resume_point(self) -> str | None:
        from deepdive.local.checkpoint import load_latest

        latest = load_latest(self.paths.checkpoints)
        return None if latest is None else f"step {latest[0]} ({self.paths.checkpoints})"
