"""The port plan of a job: which ports each node's Ray processes and services listen on.

Ports come from a band below Linux's ephemeral range (32768-60999), where the kernel never
hands out ports on its own, in blocks of BLOCK consecutive ports, one block per node. The
job's first block is derived from its id, so two jobs on one cluster start in different blocks
(consecutive ids are STRIDE blocks apart), and nodes that share a host (as emulated test nodes
do) never share a port. A node checks that every port of its block is free before it starts
anything; a taken one moves it to the next candidate block, and the ports it really uses are
published in the run folder, so no node has to guess another's. The tool server's named port
is the first of a range (TOOL_PORTS), one port per worker process.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import asdict, dataclass

LOW = 20_000
HIGH = 32_000  # exclusive; below the ephemeral range
BLOCK = 64
STRIDE = 37  # blocks between consecutive job ids; coprime with the number of slots
SLOTS = (HIGH - LOW) // BLOCK
WORKER_PORTS = 40  # Ray worker processes (tasks, actors) per node
TOOL_PORTS = 14  # the tool server's worker processes per node (services.tool_workers at most)
CANDIDATES = 8  # blocks a node tries before it gives up

# offset of each named port inside a node's block; "tools" is the first of TOOL_PORTS
OFFSETS = {
    "ray_gcs": 0,  # the head's GCS (the address workers join)
    "ray_client": 1,
    "ray_node_manager": 2,
    "ray_object_manager": 3,
    "ray_runtime_env_agent": 4,
    "ray_dashboard_agent_grpc": 5,
    "ray_dashboard_agent_listen": 6,
    "ray_metrics_export": 7,
    "reward": 8,
    "tools_unseen": 9,
    "tools": 10,
    "ray_min_worker": BLOCK - WORKER_PORTS,
}
# ports after a named one that belong to it: a service of several worker processes
RANGES = {"tools": TOOL_PORTS}


@dataclass(frozen=True)
class NodePorts:
    ray_gcs: int
    ray_client: int
    ray_node_manager: int
    ray_object_manager: int
    ray_runtime_env_agent: int
    ray_dashboard_agent_grpc: int
    ray_dashboard_agent_listen: int
    ray_metrics_export: int
    tools: int
    reward: int
    tools_unseen: int
    ray_min_worker: int

    @property
    def ray_max_worker(self) -> int:
        return self.ray_min_worker + WORKER_PORTS - 1

    def all_ports(self) -> Iterator[tuple[str, int]]:
        yield from asdict(self).items()
        for port in range(self.tools + 1, self.tools + TOOL_PORTS):
            yield "tools_worker", port
        for port in range(self.ray_min_worker + 1, self.ray_max_worker + 1):
            yield "ray_worker", port

    def service_port(self, service: str) -> int:
        port: int = getattr(self, service.replace("-", "_"))
        return port

    def service_ports(self, service: str, count: int) -> list[int]:
        """The ports of a service's `count` worker processes: its port and the ones after it,
        inside the range the plan keeps for it (one port unless RANGES names it)."""
        room = RANGES.get(service.replace("-", "_"), 1)
        if not 1 <= count <= room:
            raise PortsUnavailable(
                f"the {service} server cannot have {count} workers: the port plan keeps "
                f"{room} port{'s' if room > 1 else ''} for it"
            )
        first = self.service_port(service)
        return list(range(first, first + count))


class PortsUnavailable(RuntimeError):
    pass


def first_block(job_id: str, num_nodes: int) -> int:
    """The slot of the job's first block (its nodes take that one and the ones after it)."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    usable = max(1, SLOTS - num_nodes + 1)
    return (int(digits) * STRIDE) % usable


def block_ports(slot: int) -> NodePorts:
    base = LOW + (slot % SLOTS) * BLOCK
    return NodePorts(**{name: base + offset for name, offset in OFFSETS.items()})


def candidate_blocks(job_id: str, node: int, num_nodes: int) -> Iterator[NodePorts]:
    """The node's planned block, then the blocks a whole job's span further on, and so on."""
    first = first_block(job_id, num_nodes)
    for attempt in range(CANDIDATES):
        yield block_ports(first + node + attempt * max(num_nodes, 1) * STRIDE)


def taken(ports: NodePorts) -> list[tuple[str, int]]:
    """The ports of the block some process already listens on (or holds) on this host.

    The probe binds without SO_REUSEADDR, so a port held in any way is taken: a listener, and
    also a socket bound with SO_REUSEADDR that does not listen yet (the tool server's
    supervisor binds its workers' ports before they load their apps and listen; a probe with
    SO_REUSEADDR would call those free). The price: a port whose last connections linger in
    TIME_WAIT reads as taken too, and the node moves to its next block.
    """
    busy = []
    for name, port in ports.all_ports():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("0.0.0.0", port))  # noqa: S104 (a probe, closed at once)
            except OSError:
                busy.append((name, port))
    return busy


def plan_node_ports(job_id: str, node: int, num_nodes: int) -> tuple[NodePorts, list[str]]:
    """The first candidate block whose ports are all free, and a note for each one skipped."""
    notes: list[str] = []
    for ports in candidate_blocks(job_id, node, num_nodes):
        busy = taken(ports)
        if not busy:
            return ports, notes
        name, port = busy[0]
        notes.append(f"port {port} ({name}) is in use; block at {ports.ray_gcs} skipped")
    raise PortsUnavailable(
        f"no free block of {BLOCK} ports after {CANDIDATES} tries ({'; '.join(notes)})"
    )
