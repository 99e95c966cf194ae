"""The port plan of a job: which ports each node's Ray processes and services listen on.

Ports come from a band below Linux's ephemeral range (32768-60999), where the kernel never
hands out ports on its own, in blocks of BLOCK consecutive ports; a node takes a span of one or
more consecutive blocks: its named ports, then Ray's worker ports, as many as what the node
will run needs (worker_ports_needed). The job's first block is derived from its id, so two
jobs on one cluster start in different blocks (consecutive ids are STRIDE blocks apart), and
nodes that share a host (as emulated test nodes do) never share a port. A node checks that every port of its block is free before it starts
anything; a taken one moves it to the next candidate block, and the ports it really uses are
published in the run folder, so no node has to guess another's. The tool server's named port
is the first of a range (TOOL_PORTS), one port per worker process.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from services.base.errors import RuntimeFailure

LOW = 20_000
HIGH = 32_000  # exclusive; below the ephemeral range
BLOCK = 64
STRIDE = 37  # blocks between consecutive job ids; coprime with the number of slots
SLOTS = (HIGH - LOW) // BLOCK
NAMED = 24  # the named ports at the start of a node's span; Ray's worker ports follow
WORKER_PORTS = BLOCK - NAMED  # the fewest worker ports a node gets (the rest of one block)
# Ray's worker processes each hold one port of the node's worker range (a task's, an actor's,
# a driver's). The raylet keeps up to one idle or prestarted task worker per CPU it was given,
# and every actor with a runtime env of its own (slime gives each of its actors one) has a
# process to itself: per GPU slime runs a trainer, an SGLang engine and a placement probe.
ACTORS_PER_GPU = 3
SPARE_WORKER_PORTS = 16  # drivers, slime's rollout manager and router, our rollout workers
TOOL_PORTS = 14  # the tool server's worker processes per node (services.tool_workers at most)
CANDIDATES = 8  # spans a node tries before it gives up

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
    "ray_min_worker": NAMED,
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
    ray_max_worker: int

    @property
    def worker_ports(self) -> int:
        return self.ray_max_worker - self.ray_min_worker + 1

    def all_ports(self) -> Iterator[tuple[str, int]]:
        named = asdict(self)
        del named["ray_max_worker"]  # the end of the worker range, yielded with it
        yield from named.items()
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


class PortsUnavailable(RuntimeFailure):
    """No free span of ports on the node, or a service with more workers than its range."""


def worker_ports_needed(cpus: int, gpus: int) -> int:
    """Ray's worker ports for a node that gives Ray `cpus` CPUs and runs `gpus` GPUs: one per
    CPU (the raylet's pool of task workers), ACTORS_PER_GPU per GPU (actors with runtime envs
    of their own), and spare ones; never fewer than one block holds. With too few, actors wait
    for a port forever ("No available ports" in Ray's worker logs)."""
    return max(WORKER_PORTS, cpus + ACTORS_PER_GPU * gpus + SPARE_WORKER_PORTS)


def span_blocks(worker_ports: int) -> int:
    """How many consecutive blocks a node takes: its named ports and `worker_ports`."""
    return -(-(NAMED + worker_ports) // BLOCK)


def first_block(job_id: str, num_nodes: int, span: int = 1) -> int:
    """The slot of the job's first block (its nodes take that one and the ones after it)."""
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    usable = max(1, SLOTS - num_nodes * span + 1)
    return (int(digits) * STRIDE) % usable


def block_ports(slot: int, worker_ports: int = WORKER_PORTS) -> NodePorts:
    """The ports of a node whose span starts at block `slot` (spans never wrap past HIGH)."""
    span = span_blocks(worker_ports)
    base = LOW + (slot % (SLOTS - span + 1)) * BLOCK
    named = {name: base + offset for name, offset in OFFSETS.items()}
    return NodePorts(**named, ray_max_worker=named["ray_min_worker"] + worker_ports - 1)


def candidate_blocks(
    job_id: str, node: int, num_nodes: int, worker_ports: int = WORKER_PORTS
) -> Iterator[NodePorts]:
    """The node's planned span, then the spans a whole job's blocks further on, and so on."""
    span = span_blocks(worker_ports)
    first = first_block(job_id, num_nodes, span)
    for attempt in range(CANDIDATES):
        slot = first + node * span + attempt * max(num_nodes, 1) * span * STRIDE
        yield block_ports(slot, worker_ports)


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


def plan_node_ports(
    job_id: str, node: int, num_nodes: int, worker_ports: int = WORKER_PORTS
) -> tuple[NodePorts, list[str]]:
    """The first candidate span whose ports are all free, and a note for each one skipped."""
    notes: list[str] = []
    for ports in candidate_blocks(job_id, node, num_nodes, worker_ports):
        busy = taken(ports)
        if not busy:
            return ports, notes
        name, port = busy[0]
        notes.append(f"port {port} ({name}) is in use; block at {ports.ray_gcs} skipped")
    raise PortsUnavailable(
        f"no free span of {NAMED} + {worker_ports} ports after {CANDIDATES} tries "
        f"({'; '.join(notes)})"
    )
