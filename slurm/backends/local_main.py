"""The trainer node 0 runs for `backend = "local"`: `python -m slurm.backends.local_main RUN
--cluster ATTEMPT/cluster.json --phases ATTEMPT/node-0.phases.jsonl`.

It starts while the other nodes are still coming up and does what needs no cluster first
(its libraries, the data, the policy); when it needs rollouts it waits for cluster.json (the
Ray address and each node's service URLs, written once every node is ready) and places one
rollout worker on each node. It reads the run's resolved experiment (RUN/config.toml) and runs
the same `LocalRun` as `deepdive run`. Its milestones ("training
started") go to node 0's phase log; its exit code is the job's.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rich.console import Console

from services.cli import run_handler
from services.waiting import wait_for
from slurm.config import load_experiment, local_run_config
from slurm.phases import PhaseLog
from slurm.ray_cluster import node_resource
from slurm.run_folder import RunFolder, read_json


def train(args: argparse.Namespace) -> None:
    from deepdive.local.ray_rollouts import WorkerPool
    from deepdive.local.run import LocalRun
    from deepdive.local.summary import print_summary

    experiment = load_experiment(RunFolder(args.run).config)
    config = local_run_config(experiment)
    phases = PhaseLog(args.phases, node=0, attempt=args.cluster.parent.name)
    # the workers start now, one per node, and import their libraries while this process
    # builds the data and the policy and the other nodes join
    resources = [node_resource(node) for node in range(experiment.slurm.nodes)]
    pool = WorkerPool(os.environ["RAY_ADDRESS"], resources, config.run.threads)
    timeout_s = experiment.bootstrap.join_timeout_s
    try:
        summary = LocalRun(
            config,
            Console(stderr=True),
            cluster=functools.partial(node_rollouts, pool, args.cluster, timeout_s),
            on_event=lambda name: phases.record(name.replace(" ", "_"), "event"),
        ).run()
    finally:
        pool.close()
    print_summary(summary, Console())


def node_rollouts(
    pool: Any, cluster_file: Path, timeout_s: float, config: Any, paths: Any, say: Any
) -> AbstractContextManager[Any]:
    """Once every node is ready (the bootstrap writes cluster.json then): the pool's workers,
    each playing against its own node's services."""
    from deepdive.local.ray_rollouts import NodeServices, cluster_rollouts

    def probe() -> dict[str, Any] | None:
        note = read_json(cluster_file)
        return note if isinstance(note, dict) else None

    cluster = wait_for(probe, timeout_s=timeout_s, what=f"every node to be ready ({cluster_file})")
    nodes = [NodeServices(**node) for node in cluster["nodes"]]
    return cluster_rollouts(pool, nodes, timeout_s, config, paths, say)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm.backends.local_main")
    parser.add_argument("run", type=Path, help="the run folder")
    parser.add_argument("--cluster", type=Path, required=True)
    parser.add_argument("--phases", type=Path, required=True)
    parser.set_defaults(handler=train)
    return run_handler("deepdive trainer", parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
