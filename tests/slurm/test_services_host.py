"""Each node's services bind the node's own cluster address by default, never every interface
(0.0.0.0), unless a config asks: the default resolves on the node to the address Ray uses
(bootstrap.node_address: the default route's, or the loopback address a config pins), and no
shipped config binds a wildcard."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from services.base.errors import ConfigError
from slurm.bootstrap import NodeBootstrap
from slurm.config import NODE_ADDRESS, ExperimentConfig, load_experiment
from slurm.node.environment import NodeInfo
from slurm.node.network import ROUTE, node_address, route_address
from slurm.node.phases import NodeFailed
from slurm.node.ports import plan_node_ports

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "cluster-tiny.toml"
WILDCARDS = ("0.0.0.0", "::", "")  # what must not be bound


def test_the_default_is_the_nodes_own_address() -> None:
    assert ExperimentConfig().services.host == NODE_ADDRESS


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_no_shipped_config_binds_every_interface(path: Path) -> None:
    services = tomllib.loads(path.read_text()).get("services", {})
    assert services.get("host", NODE_ADDRESS) not in WILDCARDS


def test_a_node_binds_its_services_to_its_own_address(tmp_path: Path, corpus_file: Path) -> None:
    """The bootstrap's services phase, without a cluster: host "node" becomes the node's
    address, here cluster-tiny's loopback one (bootstrap.node_address), so the test listens on
    loopback only; with "route" it is the default route's (below)."""
    tools = f'{{search="offline", reader="offline", corpus="{corpus_file}", index_cache=false}}'
    overrides = [
        f'run.folder="{tmp_path / "run"}"',
        'run.backend="slime"',
        f'services.host="{NODE_ADDRESS}"',
        f"services.tools={tools}",
        "services.tool_workers=1",
    ]
    node = NodeInfo("424243", 0, 1, "host", "n0", restart_count=0, cpus=1)
    bootstrap = NodeBootstrap(load_experiment(TINY, overrides), node)
    ports, _ = plan_node_ports(node.job_id, node.node, node.num_nodes)
    try:
        bootstrap._launch_services(ports, {"DEEPDIVE_SERVICE_TOKEN": "a-token-for-this-test"})
        urls = {service.name: service.wait_ready() for service in bootstrap.children.services}
    finally:
        bootstrap._stop_children()
    address = "127.0.0.2"  # cluster-tiny's bootstrap.node_address
    assert bootstrap.address == address
    assert urls == {
        "tools": [f"http://{address}:{ports.tools}"],
        "reward": [f"http://{address}:{ports.reward}"],
    }


def test_the_node_address_is_the_default_routes_unless_a_config_pins_a_loopback_one() -> None:
    assert ExperimentConfig().bootstrap.node_address == ROUTE
    assert node_address(ROUTE) == route_address()
    assert node_address("127.0.0.2") == "127.0.0.2"
    assert load_experiment(TINY).bootstrap.node_address == "127.0.0.2"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("10.0.0.7", "a loopback IPv4 address"),  # every node's address: reachable on none
        ("node-1", "a loopback IPv4 address"),
        ("::1", "a loopback IPv4 address"),
        ("127.0.0.1", "ray start` replaces 127.0.0.1"),  # Ray would use the host's interface
    ],
)
def test_a_node_address_ray_or_the_other_nodes_cannot_use_is_refused(value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=r"bootstrap\.node_address") as error:
        load_experiment(TINY, [f'bootstrap.node_address="{value}"'])
    assert why in error.value.message


def test_a_node_on_another_host_than_the_head_fails_at_once_with_a_loopback_address(
    tmp_path: Path,
) -> None:
    """Loopback is reached from its own host only: a node elsewhere fails naming the setting,
    not after join_timeout_s spent waiting for a head it cannot reach."""
    config = load_experiment(TINY, [f'run.folder="{tmp_path / "run"}"'])
    elsewhere = NodeBootstrap(config, NodeInfo("424244", 1, 2, "host-b", "n2", 0, cpus=1))
    elsewhere._check_on_the_heads_host("host-b")  # the head's host: fine
    with pytest.raises(NodeFailed, match=r'set bootstrap\.node_address = "route"') as failure:
        elsewhere._check_on_the_heads_host("host-a")
    assert (failure.value.node, failure.value.phase) == (1, "launch")
    routed = load_experiment(
        TINY, [f'run.folder="{tmp_path / "run"}"', 'bootstrap.node_address="route"']
    )
    NodeBootstrap(
        routed, NodeInfo("424244", 1, 2, "host-b", "n2", 0, cpus=1)
    )._check_on_the_heads_host("host-a")
