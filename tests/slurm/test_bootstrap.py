"""Pieces of the node bootstrap that need no cluster: who a node is (from the environment
Slurm and submitit give a task), the requeue decision submitit asks of node 0, where a node's
output goes, the failure drill, and how many tool server workers a node runs on which ports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import submitit

from deepdive.rollout_settings import RolloutSettings
from services.serving.workers import MAX_DEFAULT_WORKERS
from slurm.backends import build_backend
from slurm.bootstrap import NodeBootstrap, NodeJob, drilled
from slurm.config import load_experiment
from slurm.environment import NodeInfo, current_node
from slurm.ports import plan_node_ports

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "cluster-tiny.toml"


@pytest.fixture
def task_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """What srun and submitit put in node 1's environment (job 77, 2 nodes, requeued once)."""
    for key, value in {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "77",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURMD_NODENAME": "n2",
        "SLURM_RESTART_COUNT": "1",
        "SLURM_CPUS_PER_TASK": "3",
    }.items():
        monkeypatch.setenv(key, value)
    return monkeypatch


def test_a_node_knows_its_rank_attempt_and_cpus(task_environment: pytest.MonkeyPatch) -> None:
    node = current_node()
    assert (node.job_id, node.node, node.num_nodes) == ("77", 1, 2)
    assert (node.node_name, node.restart_count, node.cpus) == ("n2", 1, 3)
    assert node.attempt == "77-1" and not node.is_head


@pytest.mark.parametrize(("restarts", "requeued"), [("1", True), ("3", False)])
def test_node_0_requeues_until_the_run_has_used_its_requeues(
    task_environment: pytest.MonkeyPatch, tmp_path: Path, restarts: str, requeued: bool
) -> None:
    task_environment.setenv("SLURM_NODEID", "0")
    task_environment.setenv("SLURM_RESTART_COUNT", restarts)
    config = load_experiment(
        ROOT / "configs" / "cluster-tiny.toml",
        [f'run.folder="{tmp_path}"', "slurm.max_requeues=3"],
    )
    job = NodeJob(config)
    again = job.checkpoint()
    end = orjson.loads((tmp_path / "attempts" / f"77-{restarts}" / "end.json").read_bytes())
    assert end["stopped"] == "signal" and end["requeue"] is requeued  # every node stops
    if requeued:
        assert isinstance(again, submitit.helpers.DelayedSubmission)
        assert again.function is job  # the same job, the same resolved experiment
    else:
        assert again is None  # submitit reads None as "do not requeue"


def test_the_node_console_takes_the_process_output_and_its_childrens(tmp_path: Path) -> None:
    log = tmp_path / "node-0.log"
    script = f"""
import subprocess, sys
from pathlib import Path
from slurm.bootstrap import node_console
with node_console(Path({str(log)!r})):
    print("from python", flush=True)
    subprocess.run(["echo", "from a child"], check=True)
print("after")
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert log.read_text().splitlines() == ["from python", "from a child"]
    assert "this node's log is" in result.stdout and result.stdout.rstrip().endswith("after")
    assert oct(log.stat().st_mode & 0o777) == "0o600"


def test_the_drill_names_a_phase_and_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPDIVE_DRILL", "services@1, services@3")
    assert drilled("services", 1) and drilled("services", 3)
    assert not drilled("services", 0) and not drilled("ray", 1)
    monkeypatch.delenv("DEEPDIVE_DRILL")
    assert not drilled("services", 1)


def test_the_tool_server_runs_services_tool_workers_or_one_per_cpu_of_the_task(
    tmp_path: Path,
) -> None:
    folder = f'run.folder="{tmp_path}"'
    unseen = "local.eval.unseen_questions=2"
    specs = {s.name: s for s in build_backend(load_experiment(TINY, [folder, unseen])).services()}
    assert specs["tools"].command_arguments(3)[-2:] == ["--workers", "3"]  # the task's CPUs
    assert specs["tools"].command_arguments(64)[-2:] == ["--workers", str(MAX_DEFAULT_WORKERS)]
    assert specs["tools-unseen"].command_arguments(64)[-2:] == ["--workers", "1"]
    assert "--workers" not in specs["reward"].command_arguments(64)
    config = load_experiment(TINY, [folder, "services.tool_workers=2", 'run.backend="slime"'])
    (tools,) = [s for s in build_backend(config).services() if s.name == "tools"]
    assert tools.command_arguments(64)[-2:] == ["--workers", "2"]


def test_a_node_serves_its_tool_workers_on_the_ports_of_their_range(
    tmp_path: Path, corpus_file: Path
) -> None:
    """What the bootstrap's services phase does, without a cluster: the tool server's workers
    on the first ports of its range, every one ready, and their URLs what the rollout gets."""
    tools = ["--search", "offline", "--reader", "offline", "--corpus", str(corpus_file)]
    overrides = [
        f'run.folder="{tmp_path / "run"}"',
        'run.backend="slime"',
        f"services.tools={json.dumps([*tools, '--no-index-cache'])}",
        "services.tool_workers=2",
    ]
    node = NodeInfo("424242", 0, 1, "host", "n0", restart_count=0, cpus=3)
    bootstrap = NodeBootstrap(load_experiment(TINY, overrides), node)
    ports, _ = plan_node_ports(node.job_id, node.node, node.num_nodes)
    try:
        bootstrap._launch_services(ports, {})
        urls = {service.name: service.wait_ready() for service in bootstrap.services}
    finally:
        bootstrap._stop_children()
    workers = [f"http://127.0.0.1:{port}" for port in (ports.tools, ports.tools + 1)]
    assert urls == {"tools": ",".join(workers), "reward": f"http://127.0.0.1:{ports.reward}"}
    assert RolloutSettings("http://s:1", urls["tools"], urls["reward"]).tool_server_urls == tuple(
        workers
    )
