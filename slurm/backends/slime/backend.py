"""`backend = "slime"`: node 0 runs slime's train.py against the job's Ray cluster, with our
hooks, and every node serves the tool and reward servers of `[services]`.

slime's own actors (its rollout manager, the SGLang engines, the Megatron trainers) run on the
job's nodes under Ray, so what they need comes through Ray's processes: each node's Ray is
started with the backend's environment (the Python path to slime and Megatron-LM,
SLIME_HOST_IP, GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME: slime.socket_ifname or the interface
that holds the node's address, slurm/node/network.py; the env file's secrets), and
our rollout's keys with the service URLs reach `args` through the --custom-config-path YAML,
which node 0 writes into the attempt's folder once every node is ready: every node's URLs
(every worker of every node's tool server, every node's reward server) from the attempt's
cluster.json, so the rollout spreads GRPO groups over all the nodes' services
(deepdive.routing). A requeued attempt's nodes serve on new addresses and ports: its own
cluster.json and YAML say so. A new attempt continues from the newest complete checkpoint in
RUN/slime_checkpoints (--load).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import yaml

from services.base.errors import ConfigError, RuntimeFailure
from services.base.files import atomic_write_bytes
from slurm.backends import EvalEngine, ServiceSpec
from slurm.backends.slime.args import (
    DRIVER_MODULE,
    custom_config,
    render,
    slime_arguments,
    slime_checkpoints,
)
from slurm.backends.slime.checks import check_slime, host_memory_warnings, missing_inputs
from slurm.backends.slime.model_context import read_config
from slurm.backends.slime.retention import (
    TRACKER,
    Pruner,
    disk_warnings,
    free_bytes,
    latest_complete,
)
from slurm.cluster_note import read_cluster
from slurm.config import ExperimentConfig
from slurm.node.network import interface_addresses, interface_for
from slurm.run_folder import AttemptFolder

CUSTOM_CONFIG = "deepdive_rollout.yaml"
# what a run's checkpoints fix: another model or layout cannot load them
CHECKPOINT_FIXED = ("model", "parallelism")


def node_memory(config: ExperimentConfig) -> tuple[float, str] | None:
    """A node's memory for the host estimate (GiB, and where the figure came from): the
    experiment's slurm.mem_gb, else the smallest RealMemory Slurm lists for the partition's
    nodes (what --mem=0 on a whole node gives; None when Slurm does not answer here)."""
    from slurm.launch.scheduler import SchedulerError, node_memory_mib

    slurm = config.slurm
    if slurm.mem_gb:
        return slurm.mem_gb, "slurm.mem_gb"
    try:
        mib = node_memory_mib(slurm.partition)
    except SchedulerError:
        return None
    where = f"partition {slurm.partition}" if slurm.partition else "the cluster"
    shared = "" if slurm.exclusive else "; a shared node gives the job less"
    return mib / 1024, f"Slurm's smallest RealMemory in {where}, {mib} MiB{shared}"


class SlimeBackend:
    name = "slime"
    starts_early = False  # train.py reads the YAML (every node's URLs) as it starts

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        self.pruner: Pruner | None = None  # node 0's, once training starts

    def check(self) -> list[str]:
        warnings = check_slime(self.config)
        warnings += host_memory_warnings(self.config, node_memory(self.config))
        model = Path(self.config.slime.model.hf_checkpoint) / "config.json"
        if model.is_file():
            folder = slime_checkpoints(self.config)
            keep = self.config.slime.checkpoint.keep_last
            warnings += disk_warnings(folder, keep, read_config(model.parent), free_bytes(folder))
        return warnings

    def check_continues(self, saved: ExperimentConfig) -> None:
        """Another model or layout cannot load the run's checkpoints."""
        changed = [
            f"slime.{table}"
            for table in CHECKPOINT_FIXED
            if getattr(saved.slime, table) != getattr(self.config.slime, table)
        ]
        if changed:
            raise ConfigError(
                f"{self.config.run.folder} was started with another {', '.join(changed)}: its "
                "checkpoints would not load; choose another run.folder"
            )

    def missing_inputs(self) -> list[str]:
        return missing_inputs(self.config)

    def input_paths(self) -> dict[str, str]:
        slime = self.config.slime
        paths = {
            "slime.model.hf_checkpoint": slime.model.hf_checkpoint,
            "slime.model.ref_load": slime.model.ref_load,
            "slime.rollout.prompt_data": slime.rollout.prompt_data,
            **{f"slime.eval.sets.{name}": path for name, path in sorted(slime.eval.sets.items())},
        }
        return {key: path for key, path in paths.items() if path}

    def eval_engine(self) -> EvalEngine:
        from slurm.backends.slime.eval_engine import SlimeEvalEngine

        return SlimeEvalEngine(self.config)

    def prepare(self) -> dict[str, Any]:
        slime_checkpoints(self.config).mkdir(parents=True, exist_ok=True)
        return {"checkpoints": str(slime_checkpoints(self.config))}

    def services(self) -> list[ServiceSpec]:
        services = self.config.services
        level = services.log_level
        return [
            ServiceSpec("tools", "tools", dict(services.tools), services.tool_workers, level),
            ServiceSpec("reward", "reward", dict(services.reward), log_level=level),
        ]

    def environment(self, node_ip: str) -> dict[str, str]:
        slime = self.config.slime
        paths = [*slime.python_path, os.environ.get("PYTHONPATH", "")]
        environment = {
            "PYTHONPATH": ":".join(path for path in paths if path),
            "SLIME_HOST_IP": node_ip,
            "PYTHONUNBUFFERED": "1",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
            # where --use-tensorboard writes (slime/observability/tensorboard_utils.py at
            # 624b824 reads it in every actor that logs); `deepdive status` reads it
            "TENSORBOARD_DIR": str(self.config.run_folder.tensorboard),
        }
        # NCCL and gloo on the interface that holds the address the other nodes reach us at;
        # a loopback or unknown address is fatal across nodes, harmless on one
        interface = slime.socket_ifname
        if not interface:
            try:
                interface = interface_for(node_ip, interface_addresses())
            except ConfigError:
                if self.config.slurm.nodes > 1:
                    raise
        if interface:
            environment["GLOO_SOCKET_IFNAME"] = interface
            environment["NCCL_SOCKET_IFNAME"] = interface
        return environment

    def before_training(self, attempt: AttemptFolder) -> None:
        """The YAML slime loads onto `args`: our rollout's keys, every node's service URLs
        (from the attempt's cluster.json)."""
        note = read_cluster(attempt.cluster)
        if note is None:
            raise RuntimeFailure(f"{attempt.cluster}: no cluster note, though every node is ready")
        keys = custom_config(self.config, note.tool_nodes, note.reward_urls)
        atomic_write_bytes(attempt.root / CUSTOM_CONFIG, yaml.safe_dump(keys).encode())
        folder = slime_checkpoints(self.config)
        # what train.py resumes from (--load): never removed while this attempt runs
        self.pruner = Pruner(
            folder, self.config.slime.checkpoint.keep_last, latest_complete(folder)
        )

    def while_training(self) -> None:
        if self.pruner is not None:
            self.pruner.tend()

    def command(self, attempt: AttemptFolder) -> list[str]:
        """slime's train.py through our driver (in slime's root: the working directory), so
        the warning saves at the next rollout boundary (slurm/backends/slime/driver.py)."""
        python = self.config.container.python if self.config.container.image else sys.executable
        arguments = slime_arguments(self.config, attempt.root / CUSTOM_CONFIG).arguments()
        return [python, "-m", DRIVER_MODULE, *arguments]

    def working_directory(self) -> str | None:
        return self.config.slime.slime_root

    def checkpoint_step(self) -> int | None:
        return latest_complete(slime_checkpoints(self.config))  # Megatron's iteration = rollout

    def resume_point(self) -> str | None:
        tracker = slime_checkpoints(self.config) / TRACKER  # Megatron writes it when a save lands
        try:
            iteration = tracker.read_text().strip()
        except OSError:
            return None
        return f"iteration {iteration} ({tracker.parent})"

    def describe(self, attempt: AttemptFolder) -> str:
        """What --dry-run prints: the grouped command line and the YAML, every node's URLs in
        it shown as the node and its ports' names (they are known once every node is up)."""
        nodes = range(self.config.slurm.nodes)
        tools = tuple((f"http://NODE{node}:TOOLS_PORT",) for node in nodes)
        reward = tuple(f"http://NODE{node}:REWARD_PORT" for node in nodes)
        command = slime_arguments(self.config, attempt.root / CUSTOM_CONFIG)
        return (
            f"{render(command, self.config.slime.slime_root)}\n\n# {attempt.root / CUSTOM_CONFIG}\n"
            f"{yaml.safe_dump(custom_config(self.config, tools, reward))}"
        )
