"""Where slime's processes talk to each other: NCCL and gloo on the interface that holds the
node's address (never a loopback one across nodes), and SGLang engines placed by the GPUs a
node really has (slime's --num-gpus-per-node defaults to 8: slime/utils/arguments.py, line 62;
slime/backends/sglang_utils/sglang_engine.py, lines 22-27 place engines by it)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from services.base.errors import ConfigError
from slurm.backends.slime.args import slime_arguments
from slurm.backends.slime.backend import SlimeBackend
from slurm.backends.slime.checks import check_slime
from slurm.node.network import interface_addresses, interface_for
from tests.helpers import slime_recipe as recipe

TABLE = {"lo": ["127.0.0.1"], "eth0": ["10.1.2.3"], "ib0": ["172.16.0.9", "172.16.1.9"]}


def test_the_interface_is_the_one_holding_the_address() -> None:
    assert interface_for("10.1.2.3", TABLE) == "eth0"
    assert interface_for("172.16.1.9", TABLE) == "ib0"  # a second address of an interface


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.1.1"])
def test_a_loopback_address_is_refused_by_name(address: str) -> None:
    """Debian maps the host name to 127.0.1.1: a node without a default route would give the
    other nodes an address they cannot reach."""
    with pytest.raises(ConfigError) as error:
        interface_for(address, {**TABLE, "lo": [address]})
    assert f"node address {address} is a loopback address" in error.value.message


def test_an_address_on_no_interface_is_refused_listing_them() -> None:
    with pytest.raises(ConfigError) as error:
        interface_for("10.9.9.9", TABLE)
    message = error.value.message
    assert "10.9.9.9 is on none of this node's interfaces" in message
    assert "eth0 10.1.2.3" in message and "slime.socket_ifname" in message


def test_the_kernels_table_is_read() -> None:
    table = interface_addresses()
    assert "127.0.0.1" in [address for found in table.values() for address in found]
    for found in table.values():
        for address in found:
            ipaddress.IPv4Address(address)


def test_every_node_gets_the_interface_of_its_address(world: dict[str, Path]) -> None:
    reachable = [
        (name, address)
        for name, found in interface_addresses().items()
        for address in found
        if not ipaddress.ip_address(address).is_loopback
    ]
    if not reachable:
        pytest.skip("this host has no non-loopback IPv4 address")
    name, address = reachable[0]
    environment = SlimeBackend(recipe(world)).environment(address)  # socket_ifname = ""
    assert environment["NCCL_SOCKET_IFNAME"] == environment["GLOO_SOCKET_IFNAME"] == name
    assert environment["SLIME_HOST_IP"] == address


def test_a_loopback_node_address_stops_a_multi_node_job(world: dict[str, Path]) -> None:
    backend = SlimeBackend(recipe(world))  # 2 nodes
    with pytest.raises(ConfigError, match=r"127\.0\.1\.1 is a loopback address"):
        backend.environment("127.0.1.1")
    one = SlimeBackend(
        recipe(
            world,
            "slurm.nodes=1",
            "slime.resources.actor_num_nodes=1",
            "slime.resources.rollout_num_gpus=8",
        )
    )
    environment = one.environment("127.0.1.1")  # one node: NCCL and gloo stay on this host
    assert "NCCL_SOCKET_IFNAME" not in environment


def test_a_4_gpu_node_tells_slime_it_has_4(world: dict[str, Path]) -> None:
    config = recipe(
        world,
        "slurm.gpus_per_node=4",
        "slime.resources.actor_num_gpus_per_node=4",
        "slime.resources.rollout_num_gpus=8",
    )
    check_slime(config)
    arguments = slime_arguments(config, Path("/x.yaml")).arguments()
    assert arguments[arguments.index("--num-gpus-per-node") + 1] == "4"
