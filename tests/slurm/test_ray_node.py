"""One node's Ray, for real, without Slurm: what a node does when Ray's worker ports run out
(reproduced small: many CPUs, a tiny worker port range, actors with runtime envs of their
own, as slime starts them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from slurm.config import load_experiment
from slurm.node.cadence import LONG_POLL_S
from slurm.node.environment import NodeInfo
from slurm.node.network import node_address
from slurm.node.phases import NodeFailed
from slurm.node.ports import NodePorts, candidate_blocks, taken
from slurm.node.ray_cluster import RayNode
from tests.helpers import TINY_JOB, FakeClock, node_watch

ROOT = Path(__file__).resolve().parents[2]
ACTORS = 8  # each with its own runtime env: a worker process (and a port) to itself
TINY_RANGE = 3  # worker ports: fewer than the node's prestarted workers and actors need

DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR")

@ray.remote(num_cpus=0.01)
class Probe:
    def ping(self):
        return 1

actors = [Probe.options(runtime_env={"env_vars": {"PROBE": str(i)}}).remote() for i in range(ACTORS)]
ready, pending = ray.wait([a.ping.remote() for a in actors], num_returns=len(actors), timeout=600)
print("ready", len(ready), "pending", len(pending), flush=True)
""".replace("ACTORS", str(ACTORS))


def free_ports(worker_ports: int) -> NodePorts:
    for job in range(41000, 41200):
        ports = next(candidate_blocks(str(job), 0, 1))
        if not taken(ports):
            return replace(ports, ray_max_worker=ports.ray_min_worker + worker_ports - 1)
    raise AssertionError("no free block on this host")


@pytest.mark.slow
def test_a_node_whose_ray_runs_out_of_worker_ports_fails_naming_the_cause(tmp_path: Path) -> None:
    """Before: the actors waited for a port forever and the job hung until its time limit.
    Now the node's watch (every LONG_POLL_S, on Ray's worker logs) fails the node with why."""
    clock = FakeClock()
    config = load_experiment(TINY_JOB, [f'run.folder="{tmp_path / "run"}"'])
    watch = node_watch(tmp_path / "run", NodeInfo("41999", 0, 1, "host", "n1", 0, 16), clock)
    address = node_address(config.bootstrap.node_address)  # cluster-tiny's loopback one
    ports = free_ports(TINY_RANGE)
    ray = watch.children.ray = RayNode(
        node=0,
        node_ip=address,  # (Ray rewrites 127.0.0.1)
        ports=ports,
        head_address=None,
        temp_dir=Path("/tmp") / f"dd-test-{os.getpid()}",  # Unix sockets: 107 bytes
        log_path=tmp_path / "ray.log",
        logs_to=tmp_path / "ray-logs",
        num_cpus=16,
        num_gpus=0,
        environment={"PYTHONPATH": str(ROOT)},
    )
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = None
    try:
        ray.launch()
        ray.wait_started(120)
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, ray.address],
            env=environment,
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120  # the failure mode is forever
        with pytest.raises(NodeFailed) as failure:
            while time.monotonic() < deadline:
                clock.now += LONG_POLL_S
                watch.check()
                time.sleep(0.5)
        message = failure.value.message
        assert "node 0 failed during" in message and "ran out of worker ports" in message
        assert f"{ports.ray_min_worker}-{ports.ray_max_worker} ({TINY_RANGE} ports" in message
        assert "No available ports" in message  # Ray's own words, and where they are
        assert driver.poll() is None  # the actors are still waiting: Ray never gives up
    finally:
        if driver is not None:
            driver.kill()
            driver.wait()
        ray.stop(5)
    assert not ray.temp_dir.exists()


def test_rays_keeper_starts_without_an_http_client() -> None:
    """The keeper (slurm.node.ray_keeper) is a Python process started in front of every node's
    Ray: what it imports delays the node's Ray start. It imported httpx through
    services.base.process (for child_preexec), ~0.7 s of CPU per node on a loaded host."""
    script = (
        "import sys, slurm.node.ray_keeper; print(sorted(m.split('.')[0] for m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    loaded = set(result.stdout.split("'")[1::2])
    assert "slurm" in loaded  # the probe saw the keeper's imports
    assert not loaded & {"httpx", "httpcore", "anyio", "starlette", "uvicorn", "ray"}
