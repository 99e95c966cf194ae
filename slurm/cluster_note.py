"""cluster.json: what node 0 hands the trainer once every node is ready, each node's Ray
resource and its services' URLs. One writer (`write_cluster`, node 0's bootstrap) and one
reader (`read_cluster`, each backend's trainer side), so the URLs keep one form: JSON lists,
a tool server's workers a list of URLs, never a joined string.

    {"attempt": "8-1", "ray_address": "10.0.0.1:6379",
     "nodes": [{"node": 0, "resource": "deepdive_node_0",
                "tools": ["http://10.0.0.1:20010", "http://10.0.0.1:20011"],
                "reward": "http://10.0.0.1:20020", "tools_unseen": null}, ...]}
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from services.base.errors import RuntimeFailure
from slurm.node.ray_cluster import node_resource
from slurm.run_folder import read_json, write_json


@dataclass(frozen=True)
class ClusterNode:
    """One node's entry: the Ray resource that places an actor there and its services."""

    node: int
    resource: str
    tools: tuple[str, ...]  # the node's tool server: every worker's base URL
    reward: str
    tools_unseen: tuple[str, ...] | None = None  # the held-out world's tool server, if any


@dataclass(frozen=True)
class ClusterNote:
    attempt: str
    ray_address: str
    nodes: tuple[ClusterNode, ...]

    @property
    def tool_nodes(self) -> tuple[tuple[str, ...], ...]:
        """Every node's tool server workers, node by node (the rollout's tool_server_url)."""
        return tuple(node.tools for node in self.nodes)

    @property
    def reward_urls(self) -> tuple[str, ...]:
        """Every node's reward server, in the same order of nodes."""
        return tuple(node.reward for node in self.nodes)


def node_from_ready(node: int, services: dict[str, list[str]]) -> ClusterNode:
    """Node `node`'s entry from its ready note's "services" (each service's workers' URLs,
    node-K.json): the tool servers' lists as they are, the reward server's one URL."""
    rewards = services["reward"]
    if len(rewards) != 1:  # the reward server is one process (ServiceSpec without workers)
        raise RuntimeFailure(f"node {node}'s reward server announced {rewards!r}, not one URL")
    (reward,) = rewards
    unseen = services.get("tools-unseen")
    return ClusterNode(
        node=node,
        resource=node_resource(node),
        tools=tuple(services["tools"]),
        reward=reward,
        tools_unseen=tuple(unseen) if unseen else None,
    )


def write_cluster(path: Path, note: ClusterNote) -> None:
    write_json(path, asdict(note))


def read_cluster(path: Path) -> ClusterNote | None:
    """The note at `path`, None while there is none. The note is the job's own: a broken one
    is a RuntimeFailure naming the file and the entry, not the user's ConfigError."""
    note = read_json(path)
    if note is None:
        return None
    nodes = note.get("nodes") if isinstance(note, dict) else None
    if not isinstance(nodes, list) or not nodes:
        raise RuntimeFailure(f"{path}: expected the job's nodes (a cluster note), got {note!r}")
    return ClusterNote(
        attempt=str(note.get("attempt")),
        ray_address=str(note.get("ray_address")),
        nodes=tuple(_node(path, position, entry) for position, entry in enumerate(nodes)),
    )


def _node(path: Path, position: int, entry: Any) -> ClusterNode:
    unseen = entry.get("tools_unseen") if isinstance(entry, dict) else None
    if not (
        isinstance(entry, dict)
        and isinstance(entry.get("node"), int)
        and isinstance(entry.get("resource"), str)
        and _urls(entry.get("tools"))
        and isinstance(entry.get("reward"), str)
        and (unseen is None or _urls(unseen))
    ):
        raise RuntimeFailure(
            f"{path}: node entry {position} lacks its node, resource, tools (a list of URLs) "
            f"and reward URL: {entry!r}"
        )
    return ClusterNode(
        node=entry["node"],
        resource=entry["resource"],
        tools=tuple(entry["tools"]),
        reward=entry["reward"],
        tools_unseen=None if unseen is None else tuple(unseen),
    )


def _urls(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(u, str) for u in value)
