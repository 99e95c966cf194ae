"""Each node's services bind the node's own cluster address by default, never every interface
(0.0.0.0), unless a config asks: the default resolves on the node to the address Ray uses, and
no shipped config binds a wildcard."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from slurm.bootstrap import NodeBootstrap, node_ip
from slurm.config import NODE_ADDRESS, ExperimentConfig, load_experiment
from slurm.environment import NodeInfo
from slurm.ports import plan_node_ports

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
    """The bootstrap's services phase, without a cluster: host "node" becomes this machine's
    cluster address (a token is then required, and given, as on a real node)."""
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
        urls = {service.name: service.wait_ready() for service in bootstrap.services}
    finally:
        bootstrap._stop_children()
    address = node_ip()
    assert urls == {
        "tools": [f"http://{address}:{ports.tools}"],
        "reward": [f"http://{address}:{ports.reward}"],
    }
