"""The trainer node 0 runs for `backend = "local"`: `python -m slurm.backends.local_main RUN
--cluster ATTEMPT/cluster.json --phases ATTEMPT/node-0.phases.jsonl`.

It starts with node 0's Ray and services, before any is up, and does what needs no cluster
first (its libraries, the data, the policy); meanwhile a thread connects to Ray once node 0's
is up and creates one rollout worker per node (placed as each node joins). When it needs
rollouts it waits for cluster.json (each node's service URLs, written once every node is
ready). It reads the run's resolved experiment (RUN/config.toml) and runs
the same `LocalRun` as `deepdive run`. Its milestones ("training
started") go to node 0's phase log; its exit code is the job's.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rich.console import Console

from services.base.cli import run_handler
from services.base.waiting import wait_for
from slurm.cluster_note import read_cluster
from slurm.config import load_experiment, local_run_config
from slurm.node.phases import PhaseLog
from slurm.node.ray_cluster import node_resource
from slurm.run_folder import AttemptFolder, RunFolder


def train(args: argparse.Namespace) -> None:
    from deepdive.local.run import LocalRun
    from deepdive.local.summary import print_summary

    experiment = load_experiment(RunFolder(args.run).config)
    config = local_run_config(experiment)
    phases = PhaseLog(args.phases, node=0, attempt=args.cluster.parent.name)
    timeout_s = experiment.bootstrap.join_timeout_s
    # the workers start as soon as node 0's Ray is up, one per node, and import their
    # libraries while this process builds the data and the policy and the other nodes join
    resources = [node_resource(node) for node in range(experiment.slurm.nodes)]
    head_ready = AttemptFolder(args.cluster.parent).ready(0)
    pool = PoolStarter(os.environ["RAY_ADDRESS"], resources, config.run.threads)
    pool.start(head_ready, timeout_s)
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


class PoolStarter:
    """The rollout workers' pool, made in a thread of its own once node 0's Ray is up.

    The trainer starts while Ray is still coming up (the bootstrap starts it with Ray and the
    services), so the pool waits for node 0's ready note (Ray up, services answering) before
    it connects; meanwhile the main thread builds the data and the policy. Ray's driver sets
    its SIGTERM handler (exit, so `finally` blocks run) only from the main thread: it is set
    here instead, and Ray's warning that it could not is dropped."""

    def __init__(self, address: str, resources: list[str], threads: int) -> None:
        self.address = address
        self.resources = resources
        self.threads = threads
        self._pool: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, head_ready: Path, timeout_s: float) -> None:
        signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(number))
        logging.getLogger("ray._private.worker").addFilter(_NotMainThreadWarning())
        self._thread = threading.Thread(
            target=self._connect, args=(head_ready, timeout_s), name="worker-pool", daemon=True
        )
        self._thread.start()

    def _connect(self, head_ready: Path, timeout_s: float) -> None:
        from deepdive.local.ray_rollouts import WorkerPool

        try:
            wait_for(head_ready.exists, timeout_s=timeout_s, what=f"node 0's Ray ({head_ready})")
            self._pool = WorkerPool(self.address, self.resources, self.threads)
        except BaseException as error:  # the main thread raises it when it needs the pool
            self._error = error

    def pool(self) -> Any:
        """The pool, once made (its error, if making it failed)."""
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


class _NotMainThreadWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "not the main thread" not in record.getMessage()


def node_rollouts(
    pool: PoolStarter, cluster_file: Path, timeout_s: float, config: Any, paths: Any, say: Any
) -> AbstractContextManager[Any]:
    """Once every node is ready (the bootstrap writes cluster.json then): the pool's workers,
    each playing against its own node's services."""
    from deepdive.local.ray_rollouts import NodeServices, cluster_rollouts

    workers = pool.pool()
    cluster = wait_for(
        functools.partial(read_cluster, cluster_file),
        timeout_s=timeout_s,
        what=f"every node to be ready ({cluster_file})",
    )
    nodes = [
        NodeServices(node.node, node.resource, node.tools, node.reward, node.tools_unseen)
        for node in cluster.nodes
    ]
    return cluster_rollouts(workers, nodes, timeout_s, config, paths, say)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm.backends.local_main")
    parser.add_argument("run", type=Path, help="the run folder")
    parser.add_argument("--cluster", type=Path, required=True)
    parser.add_argument("--phases", type=Path, required=True)
    parser.set_defaults(handler=train)
    return run_handler("deepdive trainer", parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
