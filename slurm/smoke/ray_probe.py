"""Step 3's trainer: what node 0 runs in place of train.py once the bootstrap has every node
ready (`python -m slurm.smoke.ray_probe`, RAY_ADDRESS set by the bootstrap).

It checks that the job's Ray cluster is what slime will place its actors on: every node alive
with its deepdive_node_K resource and its GPUs, and one actor per GPU of every node started,
each pinned to its node and given a runtime env of its own (as slime gives its actors one:
a new worker process each, through the node's runtime-env agent and worker ports), within a
deadline that names the actors that never started. Its checks go to --result as JSON; its
exit code is 0 only when they all pass.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slurm.node.ray_cluster import node_resource
from slurm.run_folder import write_json
from slurm.smoke.report import Check, failed, passed

ACTOR_ENV = "DEEPDIVE_SMOKE_ACTOR"  # each actor's own runtime env sets it to "NODE.INDEX"


class Where:
    """A Ray actor that says where it runs and what it was given."""

    def where(self) -> dict[str, Any]:
        import ray

        return {
            "env": os.environ.get(ACTOR_ENV),
            "node_id": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(gpu) for gpu in ray.get_gpu_ids()],
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }


def node_checks(nodes: list[dict[str, Any]], num_nodes: int, gpus: int) -> list[Check]:
    """Ray's view (ray.nodes()) against the job: every node alive with deepdive_node_K and
    its GPUs."""
    alive = [node for node in nodes if node.get("Alive")]
    found = {}
    for index in range(num_nodes):
        holders = [node for node in alive if node_resource(index) in node.get("Resources", {})]
        if holders:
            found[index] = holders[0]
    missing = [node_resource(index) for index in range(num_nodes) if index not in found]
    shown = ", ".join(
        f"{node_resource(index)} at {node['NodeManagerAddress']} "
        f"({node['Resources'].get('GPU', 0):g} GPU)"
        for index, node in sorted(found.items())
    )
    if missing or len(alive) != num_nodes:
        checks = [
            failed(
                "Ray nodes",
                f"{len(alive)} alive for {num_nodes} job node(s); missing: "
                f"{', '.join(missing) or 'none'} (seen: {shown or 'none'})",
            )
        ]
    else:
        checks = [passed("Ray nodes", f"{num_nodes} alive: {shown}")]
    if gpus == 0:
        checks.append(failed("Ray GPUs", "no GPU: slurm.gpus_per_node is 0, so Ray was given none"))
        return checks
    short = [
        f"{node_resource(index)} has {node['Resources'].get('GPU', 0):g}"
        for index, node in sorted(found.items())
        if node["Resources"].get("GPU", 0) != gpus
    ]
    if short:
        checks.append(failed("Ray GPUs", f"expected {gpus} GPU(s) per node: {'; '.join(short)}"))
    else:
        checks.append(passed("Ray GPUs", f"{gpus} per node on {len(found)} node(s)"))
    return checks


def actor_check(
    expected: list[tuple[int, int]],
    answers: dict[tuple[int, int], dict[str, Any] | None],
    node_ids: dict[int, str],
    gpus: int,
    timeout_s: float,
) -> Check:
    """Every actor answered from its own node, with its own runtime env and one GPU."""
    problems = []
    for node, index in expected:
        answer = answers.get((node, index))
        who = f"actor {index} on node {node}"
        if answer is None:
            problems.append(f"{who} did not start within {timeout_s:g} s")
            continue
        if answer["env"] != f"{node}.{index}":
            problems.append(f"{who} lacks its runtime env ({ACTOR_ENV}={answer['env']})")
        if node_ids.get(node) != answer["node_id"]:
            problems.append(f"{who} ran on another node ({answer['host']})")
        if gpus and len(answer["gpu_ids"]) != 1:
            problems.append(f"{who} was given GPUs {answer['gpu_ids']}, not one")
    name = "GPU actors with their own runtime env" if gpus else "actors with their own runtime env"
    if problems:
        shown = "; ".join(problems[:6])
        more = f" (and {len(problems) - 6} more)" if len(problems) > 6 else ""
        hint = " (Ray's worker ports or runtime-env agent? see each node's ray.log)"
        return failed(name, f"{shown}{more}{hint if any('start' in p for p in problems) else ''}")
    per_node = max(gpus, 1)
    return passed(name, f"{len(expected)} started, {per_node} per node, each on its own node")


def probe(num_nodes: int, gpus: int, timeout_s: float) -> list[Check]:
    import logging

    import ray

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level=logging.WARNING)
    try:
        nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
        checks = node_checks(nodes, num_nodes, gpus)
        node_ids = {
            index: str(node["NodeID"])
            for node in nodes
            if node.get("Alive")
            for index in range(num_nodes)
            if node_resource(index) in node.get("Resources", {})
        }
        expected = [(node, index) for node in range(num_nodes) for index in range(max(gpus, 1))]
        actor: Any = ray.remote(Where)
        handles = {
            (node, index): actor.options(
                num_cpus=0,
                num_gpus=1 if gpus else 0,
                resources={node_resource(node): 0.001},
                runtime_env={"env_vars": {ACTOR_ENV: f"{node}.{index}"}},
            ).remote()
            for node, index in expected
        }
        refs = {key: handle.where.remote() for key, handle in handles.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        answers = {key: ray.get(ref) if ref in done else None for key, ref in refs.items()}
        checks.append(actor_check(expected, answers, node_ids, gpus, timeout_s))
        return checks
    finally:
        ray.shutdown()


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m slurm.smoke.ray_probe")
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--result", type=Path, required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    checks = probe(args.nodes, args.gpus_per_node, args.timeout_s)
    write_json(args.result, {"checks": [vars(check) for check in checks]})
    for check in checks:
        print(check.line(), flush=True)
    return 0 if all(check.ok for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
