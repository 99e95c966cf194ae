"""A local run's episodes spread over the nodes of a Slurm job: one rollout worker per node.

Each worker is a Ray actor pinned to its node by the node's custom resource. The pool creates
them as soon as the trainer starts, so their imports overlap the trainer's own start; once
every node is ready each loads its own copy of the policy behind the local engine (the run's
base model, on shared storage) and points it at its own node's tool and reward servers. After
each update the trainer puts the new weights in Ray's object store once and every worker loads
them. A step's groups are dealt out round-robin (group g to worker g mod N); each sample keeps
its index in the whole batch, and with it its sampling seed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from deepdive.local.config import LocalRunConfig
from deepdive.local.episodes import UNSEEN, WORLD, ServiceSet, rollout_batch
from deepdive.local.rollouts import settings_for
from deepdive.local.stack import engine_server
from deepdive.rollout_settings import rollout_args
from deepdive.run_paths import RunPaths
from services.base.errors import RuntimeFailure


@dataclass(frozen=True)
class NodeServices:
    """What one node of the job offers a rollout worker."""

    node: int
    resource: str  # the Ray custom resource that places an actor on this node
    tools: tuple[str, ...]  # the node's tool server workers' base URLs
    reward: str
    tools_unseen: tuple[str, ...] | None = None


class WorkerStartError(RuntimeFailure):
    code = "rollout_worker_failed"


class RolloutWorker:
    """The body of one node's Ray actor: an engine in this process and the node's services.

    It is created as soon as the trainer starts (its first seconds go to importing torch and
    transformers, while the trainer builds the data and the policy); `setup` then loads the
    policy and points it at its node's services."""

    def __init__(self, threads: int) -> None:
        import torch

        import deepdive.local.engine
        import deepdive.local.model  # noqa: F401 (imported now: transformers takes seconds)

        torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
        self._stack = ExitStack()
        self.node = -1
        self.args: dict[ServiceSet, Any] = {}
        self.engine: Any = None

    def setup(self, config: LocalRunConfig, base_model: str, services: NodeServices) -> int:
        from deepdive.local.model import load_model

        model, tokenizer = load_model(base_model)
        self.node = services.node
        sglang, self.engine = self._stack.enter_context(
            engine_server(model, tokenizer, config.rollout.max_batch)
        )
        self.args[WORLD] = rollout_args(
            settings_for(config, sglang, services.tools, services.reward), tokenizer
        )
        if services.tools_unseen:
            self.args[UNSEEN] = rollout_args(
                settings_for(config, sglang, services.tools_unseen, services.reward), tokenizer
            )
        return self.node

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)

    def run(
        self,
        services: ServiceSet,
        rows: list[dict[str, Any]],
        groups: list[int],
        group_size: int,
        params: dict[str, Any],
        seed: str,
    ) -> list[Any]:
        return asyncio.run(
            rollout_batch(self.args[services], rows, group_size, params, seed, groups)
        )

    def close(self) -> None:
        self._stack.close()


class WorkerPool:
    """A rollout worker for each node of the job's Ray cluster (one per custom resource),
    created at once: Ray places each as soon as its node has joined."""

    def __init__(self, address: str, resources: list[str], threads: int) -> None:
        import ray

        ray.init(address=address, logging_level=logging.WARNING, configure_logging=False)
        actor = ray.remote(RolloutWorker)
        self.resources = resources
        self.workers: list[Any] = [  # Ray's actor handles
            actor.options(num_cpus=0, resources={resource: 1}).remote(threads)
            for resource in resources
        ]

    def rollouts(
        self, nodes: list[NodeServices], config: LocalRunConfig, base_model: str, timeout_s: float
    ) -> RayRollouts:
        """Every worker loaded with the policy and its node's services, within `timeout_s`."""
        import ray

        by_resource = {node.resource: node for node in nodes}
        missing = [r for r in self.resources if r not in by_resource]
        if missing:
            raise WorkerStartError(f"no services for {', '.join(missing)} in the cluster file")
        placed = [by_resource[resource] for resource in self.resources]
        pending = {
            worker.setup.remote(config, base_model, node): node
            for worker, node in zip(self.workers, placed, strict=True)
        }
        ready, late = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        if late:
            names = ", ".join(str(pending[ref].node) for ref in late)
            raise WorkerStartError(
                f"the rollout worker of node {names} did not start within {timeout_s:g} s"
            )
        ray.get(ready)  # a worker that failed to start raises its error here
        return RayRollouts(self.workers, [node.node for node in placed])

    def close(self) -> None:
        import ray

        for worker in self.workers:
            ray.kill(worker)
        ray.shutdown()


class RayRollouts:
    def __init__(self, workers: list[Any], nodes: list[int]) -> None:
        self.workers = workers
        self.nodes = nodes
        self._counts: dict[int, int] = {}

    def run(
        self,
        services: ServiceSet,
        rows: list[dict[str, Any]],
        group_size: int,
        params: dict[str, Any],
        seed: str,
    ) -> list[Any]:
        import ray

        futures = []
        for w, worker in enumerate(self.workers):
            groups = list(range(w, len(rows), len(self.workers)))
            picked = [rows[g] for g in groups]
            futures.append(worker.run.remote(services, picked, groups, group_size, params, seed))
        results = ray.get(futures)
        self._counts = {node: len(part) for node, part in zip(self.nodes, results, strict=True)}
        return sorted((s for part in results for s in part), key=lambda s: s.index)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import ray

        weights = ray.put(state)  # one copy in the object store, fetched by every worker
        ray.get([worker.load_state_dict.remote(weights) for worker in self.workers])

    def node_counts(self) -> dict[int, int]:
        return dict(self._counts)


@contextmanager
def cluster_rollouts(
    pool: WorkerPool,
    nodes: list[NodeServices],
    timeout_s: float,
    config: LocalRunConfig,
    paths: RunPaths,
    say: Any,
) -> Iterator[RayRollouts]:
    """The pool's workers loaded with the run's policy and their nodes' services (the pool's
    owner ends them)."""
    rollouts = pool.rollouts(nodes, config, str(paths.base_model), timeout_s)
    say(f"rollout workers: one on each of nodes {', '.join(str(n.node) for n in nodes)}")
    yield rollouts
