"""The port plan: below the ephemeral range, distinct per node and per job, checked free."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from services.serving.serve import bind
from slurm.node.ports import (
    BLOCK,
    HIGH,
    LOW,
    TOOL_PORTS,
    NodePorts,
    PortsUnavailable,
    block_ports,
    candidate_blocks,
    first_block,
    plan_node_ports,
    taken,
)


def ports_of(plan: NodePorts) -> set[int]:
    return {port for _, port in plan.all_ports()}


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except OSError:  # not Linux: the IANA range starts at 49152
        return 49152


def test_every_port_is_below_the_ephemeral_range_and_inside_its_block() -> None:
    assert ephemeral_low() >= HIGH
    for slot in range(0, (HIGH - LOW) // BLOCK):
        plan = block_ports(slot)
        ports = ports_of(plan)
        assert len(ports) == len(list(plan.all_ports()))  # no port named twice
        assert min(ports) >= LOW + slot * BLOCK and max(ports) < LOW + (slot + 1) * BLOCK < HIGH


def test_nodes_of_a_job_never_share_a_port() -> None:
    """Emulated nodes share one host: node k must not collide with node j."""
    for job in ("7", "12345", "999999"):
        plans = [next(candidate_blocks(job, node, 8)) for node in range(8)]
        for i, a in enumerate(plans):
            for b in plans[i + 1 :]:
                assert not ports_of(a) & ports_of(b)


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_consecutive_jobs_get_disjoint_ports(nodes: int) -> None:
    for job in range(1, 400):
        mine = set().union(
            *(ports_of(next(candidate_blocks(str(job), n, nodes))) for n in range(nodes))
        )
        theirs = set().union(
            *(ports_of(next(candidate_blocks(str(job + 1), n, nodes))) for n in range(nodes))
        )
        assert not mine & theirs, job


def test_the_plan_is_a_function_of_the_job_id() -> None:
    assert first_block("4242", 2) == first_block("4242", 2)
    assert next(candidate_blocks("4242", 1, 2)) == next(candidate_blocks("4242", 1, 2))
    assert first_block("4242_3", 2) == first_block("42423", 2)  # an array task's id: its digits


def job_with_a_free_block(num_nodes: int) -> str:
    """A job id whose node 0 block nothing on this host holds: CI shares the host with the
    other tests' Ray clusters and services, so a fixed id's block may be busy already."""
    for job in range(31337, 31337 + 200):
        if not taken(next(candidate_blocks(str(job), 0, num_nodes))):
            return str(job)
    raise AssertionError("no job id with a free first block on this host")


def test_a_taken_port_moves_the_node_to_the_next_free_block() -> None:
    job = job_with_a_free_block(2)
    planned = next(candidate_blocks(job, 0, 2))
    holder = socket.socket()
    holder.bind(("127.0.0.1", planned.tools))
    holder.listen()
    try:
        chosen, notes = plan_node_ports(job, 0, 2)
    finally:
        holder.close()
    assert chosen != planned and not ports_of(chosen) & ports_of(planned)
    assert notes and str(planned.tools) in notes[0] and "tools" in notes[0]


def test_no_free_block_is_a_clear_error() -> None:
    holders = []
    try:
        for plan in candidate_blocks("5", 0, 1):
            holder = socket.socket()
            holders.append(holder)
            # held whatever its state (a port of an earlier test may linger in TIME_WAIT)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                holder.bind(("127.0.0.1", plan.ray_gcs))  # the probe binds every address
                holder.listen()
            except OSError as error:  # another process on this shared host holds it: taken
                if error.errno != errno.EADDRINUSE:
                    raise
        with pytest.raises(PortsUnavailable, match="no free span"):
            plan_node_ports("5", 0, 1)
    finally:
        for holder in holders:
            holder.close()


def test_the_tool_server_has_a_range_of_ports_one_per_worker() -> None:
    plan = block_ports(3)
    tools = plan.service_ports("tools", TOOL_PORTS)
    assert tools == list(range(plan.tools, plan.tools + TOOL_PORTS))
    others = {port for name, port in plan.all_ports() if name not in ("tools", "tools_worker")}
    assert not set(tools) & others  # checked free with the rest of the block, never shared
    assert {port for name, port in plan.all_ports() if name == "tools_worker"} == set(tools[1:])
    assert plan.service_ports("tools-unseen", 1) == [plan.tools_unseen]
    with pytest.raises(PortsUnavailable, match=f"keeps {TOOL_PORTS} ports for it"):
        plan.service_ports("tools", TOOL_PORTS + 1)
    with pytest.raises(PortsUnavailable, match="keeps 1 port for it"):
        plan.service_ports("reward", 2)


def test_a_taken_tool_worker_port_moves_the_node_too() -> None:
    job = job_with_a_free_block(1)
    planned = next(candidate_blocks(job, 0, 1))
    holder = socket.socket()
    holder.bind(("127.0.0.1", planned.tools + TOOL_PORTS - 1))
    holder.listen()
    try:
        chosen, notes = plan_node_ports(job, 0, 1)
    finally:
        holder.close()
    assert chosen != planned and notes and "tools_worker" in notes[0]


def test_a_port_bound_but_not_listening_yet_is_taken() -> None:
    """The tool server's supervisor binds every worker's port (with SO_REUSEADDR, as
    services.serving.serve.bind does) before the workers load their apps and listen: a second job must
    not plan that block, or whichever server listens second fails."""
    job = job_with_a_free_block(1)
    planned = next(candidate_blocks(job, 0, 1))
    holder = bind("127.0.0.1", planned.tools + 1)  # bound, not listening
    try:
        chosen, notes = plan_node_ports(job, 0, 1)
    finally:
        holder.close()
    assert chosen != planned and notes and "tools_worker" in notes[0]
