"""A local run's episodes spread over the nodes of a Slurm job: one rollout worker per node.

Each worker is a Ray actor pinned to its node by the node's custom resource. It holds its own
copy of the policy behind the local engine (loaded from the run's base model on shared storage,
then kept in step with the trainer: after each update the trainer puts the new weights in Ray's
object store once and every worker loads them) and plays its episodes against its own node's
tool and reward servers. A step's groups are dealt out round-robin (group g to worker
g mod N); each sample keeps its index in the whole batch, and with it its sampling seed.
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
from deepdive.local.paths import RunPaths
from deepdive.local.rollouts import settings_for
from deepdive.local.stack import engine_server
from deepdive.rollout_settings import rollout_args
from services.exceptions import ServiceError


@dataclass(frozen=True)
class NodeServices:
    """What one node of the job offers a rollout worker."""

    node: int
    resource: str  # the Ray custom resource that places an actor on this node
    tools: str
    reward: str
    tools_unseen: str | None = None


class WorkerStartError(ServiceError):
    code = "rollout_worker_failed"


class RolloutWorker:
    """The body of one node's Ray actor: an engine in this process and the node's services."""

    def __init__(self, config: LocalRunConfig, base_model: str, services: NodeServices) -> None:
        import torch

        from deepdive.local.model import load_model

        torch.set_num_threads(config.run.threads or len(os.sched_getaffinity(0)))
        model, tokenizer = load_model(base_model)
        self.node = services.node
        self._stack = ExitStack()
        sglang, self.engine = self._stack.enter_context(
            engine_server(model, tokenizer, config.rollout.max_batch)
        )
        self.args = {
            WORLD: rollout_args(
                settings_for(config, sglang, services.tools, services.reward), tokenizer
            )
        }
        if services.tools_unseen:
            self.args[UNSEEN] = rollout_args(
                settings_for(config, sglang, services.tools_unseen, services.reward), tokenizer
            )

    def ready(self) -> int:
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
    nodes: list[NodeServices],
    address: str,
    start_timeout_s: float,
    config: LocalRunConfig,
    paths: RunPaths,
    say: Any,
) -> Iterator[RayRollouts]:
    """Connect to the job's Ray cluster, start a worker on every node and wait until each has
    loaded the policy; the workers are ended when the block ends."""
    import ray

    ray.init(address=address, logging_level=logging.WARNING, configure_logging=False)
    workers: list[Any] = []
    try:
        actor = ray.remote(RolloutWorker)
        for node in nodes:
            workers.append(
                actor.options(num_cpus=0, resources={node.resource: 1}).remote(
                    config, str(paths.base_model), node
                )
            )
        pending = {worker.ready.remote(): node for worker, node in zip(workers, nodes, strict=True)}
        ready, missing = ray.wait(list(pending), num_returns=len(pending), timeout=start_timeout_s)
        if missing:
            late = ", ".join(str(pending[ref].node) for ref in missing)
            raise WorkerStartError(
                f"the rollout worker of node {late} did not start within {start_timeout_s:g} s"
            )
        ray.get(ready)  # a worker that failed to start raises its error here
        say(f"rollout workers: one on each of nodes {', '.join(str(n.node) for n in nodes)}")
        yield RayRollouts(workers, [node.node for node in nodes])
    finally:
        for worker in workers:
            ray.kill(worker)
        ray.shutdown()
