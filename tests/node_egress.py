"""A node's egress probe in the tests, run as a node runs it: a tool server of one worker started
as a node starts it, the probe alone against it, and node 0's services phase as the bootstrap runs
it. Shared by tests/slurm/test_egress_probe.py and tests/slurm/test_site_egress.py (whose node
runs them inside a namespace with no route out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.base.process import ServiceProcess
from slurm.backends import ServiceSpec
from slurm.bootstrap import NodeBootstrap
from slurm.config import load_experiment
from slurm.node.egress import ProbeResult, Upstreams, probe_egress
from slurm.node.environment import NodeInfo
from slurm.node.phases import read_phases
from slurm.node.ports import plan_node_ports
from tests.helpers import clean_environment

ROOT = Path(__file__).resolve().parent.parent
INTERNET = Upstreams("serper", "jina")


def start_tools(folder: Path, table: dict[str, Any], environment: dict[str, str]) -> ServiceProcess:
    """A tool server of one worker, started as a node starts it."""
    spec = ServiceSpec("tools", "tools", table, workers=1)
    config = spec.write_config(folder)
    arguments = [*spec.command_arguments(1, config), "--host", "127.0.0.1"]
    service = ServiceProcess("tools", arguments, folder / "tools.log", 60, environment)
    service.start()
    return service


def probe(folder: Path, table: dict[str, Any], environment: dict[str, str]) -> ProbeResult:
    service = start_tools(folder, table, environment)
    try:
        return probe_egress(
            service.urls[0], INTERNET, session="probe", timeout_s=60, environment=environment
        )
    finally:
        service.stop()


TINY = ROOT / "configs" / "cluster-tiny.toml"


def node_bootstrap(folder: Path, job: str, tools: str, *extra: str) -> NodeBootstrap:
    """Node 0 of a 1-node slime job whose services bind loopback, as a node builds it."""
    overrides = [
        f'run.folder="{folder / "run"}"',
        'run.backend="slime"',
        'services.host="127.0.0.1"',
        f"services.tools={tools}",
        "services.tool_workers=1",
        *extra,
    ]
    node = NodeInfo(job, 0, 1, "host", "n0", restart_count=0, cpus=1)
    return NodeBootstrap(load_experiment(TINY, overrides), node)


def services_phase(
    bootstrap: NodeBootstrap, environment: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The node's launch and services phases (no Ray, no Slurm); its phase log's probe lines.
    `environment`: what the services get beside this process's (the env file's values)."""
    ports, _ = plan_node_ports(bootstrap.node.job_id, 0, 1)
    try:
        bootstrap._launch_services(ports, environment or clean_environment())
        with bootstrap.phases.phase("services"):
            bootstrap._services_ready()
    finally:
        bootstrap._stop_children()
    lines = read_phases(bootstrap.attempt.phases(0))
    return [line for line in lines if line["phase"] == "egress_probe"]
