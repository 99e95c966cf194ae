"""Pieces of the node bootstrap that need no cluster: who a node is (from the environment
Slurm and submitit give a task), the requeue decision submitit asks of node 0, where a node's
output goes, the failure drill, and how many tool server workers a node runs on which ports."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import orjson
import pytest
import submitit

from deepdive.rollout_settings import RolloutSettings
from services.serving.workers import MAX_DEFAULT_WORKERS
from slurm.backends import build_backend
from slurm.bootstrap import NodeBootstrap, NodeJob, drilled
from slurm.config import load_experiment
from slurm.node.environment import CpuGrant, NodeInfo, current_node
from slurm.node.phases import Stopping, read_phases
from slurm.node.ports import HIGH, plan_node_ports
from slurm.run_folder import write_json
from tests.helpers import FakeClock, wait_until

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
    affinity = len(os.sched_getaffinity(0))
    assert (node.node_name, node.restart_count) == ("n2", 1)
    assert node.cpu_grant == CpuGrant(slurm=3, affinity=affinity)
    assert node.cpus == min(3, affinity)  # what the task may run on, at most what Slurm gave
    assert node.attempt == "77-1" and not node.is_head


@pytest.mark.parametrize(
    ("slurm", "affinity", "usable", "why"),
    [
        (64, 1, 1, "srun was started without --cpus-per-task"),  # 22.05's srun, core binding
        (1, 2, 1, "nothing binds tasks to their CPUs: task/none"),  # the others are another job's
        (0, 3, 3, ""),  # Slurm names no count: the affinity alone
        (2, 2, 2, ""),
    ],
)
def test_a_node_is_sized_to_its_affinity_at_most_what_slurm_gave(
    slurm: int, affinity: int, usable: int, why: str
) -> None:
    grant = CpuGrant(slurm=slurm, affinity=affinity)
    assert grant.usable == usable
    assert grant.differs is bool(why)
    assert why in grant.describe()


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


FILE = Path("tools.toml")


def test_the_tool_server_runs_services_tool_workers_or_one_per_cpu_of_the_task(
    tmp_path: Path,
) -> None:
    folder = f'run.folder="{tmp_path}"'
    unseen = "local.eval.unseen_questions=2"
    specs = {s.name: s for s in build_backend(load_experiment(TINY, [folder, unseen])).services()}
    assert specs["tools"].command_arguments(3, FILE)[-2:] == ["--workers", "3"]  # the task's CPUs
    assert specs["tools"].command_arguments(64, FILE)[-2:] == [
        "--workers",
        str(MAX_DEFAULT_WORKERS),
    ]
    assert specs["tools-unseen"].command_arguments(64, FILE)[-2:] == ["--workers", "1"]
    assert "--workers" not in specs["reward"].command_arguments(64, FILE)
    config = load_experiment(TINY, [folder, "services.tool_workers=2", 'run.backend="slime"'])
    (tools,) = [s for s in build_backend(config).services() if s.name == "tools"]
    assert tools.command_arguments(64, FILE)[-2:] == ["--workers", "2"]


def test_a_node_serves_its_tool_workers_on_the_ports_of_their_range(
    tmp_path: Path, corpus_file: Path
) -> None:
    """What the bootstrap's services phase does, without a cluster: the tool server's workers
    on the first ports of its range, every one ready, and their URLs what the rollout gets."""
    tools = f'{{search="offline", reader="offline", corpus="{corpus_file}", index_cache=false}}'
    overrides = [
        f'run.folder="{tmp_path / "run"}"',
        'run.backend="slime"',
        f"services.tools={tools}",
        "services.tool_workers=2",
    ]
    node = NodeInfo("424242", 0, 1, "host", "n0", restart_count=0, cpus=3)
    bootstrap = NodeBootstrap(load_experiment(TINY, overrides), node)
    ports, _ = plan_node_ports(node.job_id, node.node, node.num_nodes)
    try:
        bootstrap._launch_services(ports, {})
        urls = {service.name: service.wait_ready() for service in bootstrap.children.services}
    finally:
        bootstrap._stop_children()
    workers = [f"http://127.0.0.1:{port}" for port in (ports.tools, ports.tools + 1)]
    assert urls == {"tools": workers, "reward": [f"http://127.0.0.1:{ports.reward}"]}
    settings = RolloutSettings(
        sglang_url="http://s:1",
        tool_server_url=(tuple(urls["tools"]),),
        reward_server_url=tuple(urls["reward"]),
    )
    assert settings.tool_server_urls == tuple(workers)
    # each service's config, written into the node's folder of the attempt, handed by --config
    folder = bootstrap.attempt.node_logs(0)
    tools_file = folder / "tools.toml"
    assert tomllib.loads(tools_file.read_text())["corpus"] == str(corpus_file)
    assert tomllib.loads((folder / "reward.toml").read_text()) == {}  # the defaults
    assert (folder / "tools.log").is_file()


def bootstrap_at(tmp_path: Path, node: int, clock: FakeClock, cpus: int = 2) -> NodeBootstrap:
    config = load_experiment(TINY, [f'run.folder="{tmp_path / "run"}"'])
    return NodeBootstrap(config, NodeInfo("4711", node, 2, "host", "n1", 0, cpus), clock)


def test_a_gpu_node_gives_ray_a_worker_port_for_every_cpu_and_actor(tmp_path: Path) -> None:
    """Ray keeps up to one idle or prestarted worker per CPU and every slime actor (its own
    runtime env) has a process of its own, each holding a worker port: the recipe's nodes
    (64 CPUs, 8 GPUs) had 40 ports, and slime's actors waited for one forever."""
    config = load_experiment(TINY, [f'run.folder="{tmp_path}"', "slurm.gpus_per_node=8"])
    bootstrap = NodeBootstrap(config, NodeInfo("4712", 0, 2, "host", "n1", 0, 64))
    ports, _ = bootstrap._plan_ports()
    assert ports.worker_ports >= 64 + 3 * 8
    named = {port for name, port in ports.all_ports() if not name.startswith("ray_")}
    workers = set(range(ports.ray_min_worker, ports.ray_max_worker + 1))
    assert not named & workers and max(workers) < HIGH
    other = NodeBootstrap(config, NodeInfo("4712", 1, 2, "host", "n1", 0, 64))._plan_ports()[0]
    assert not {p for _, p in other.all_ports()} & {p for _, p in ports.all_ports()}


@pytest.mark.slow
def test_node_0_publishes_the_heads_address_before_its_ray_is_up(tmp_path: Path) -> None:
    """The other nodes start their Ray at once and Ray's own retry joins them when the head
    answers (their start overlaps the head's). Before, node 0 wrote head.json only once its
    Ray was up, and node 1 started Ray only then: 6-8 s after the head on a loaded host."""
    bootstrap = bootstrap_at(tmp_path, 0, FakeClock())
    attempt = bootstrap.attempt
    attempt.root.mkdir(parents=True)
    write_json(attempt.storage_probe(1), {"nonce": "node 1's"})  # node 1, as seen on storage
    outcome: list[BaseException | int] = []

    def node_0() -> None:
        try:
            outcome.append(bootstrap._run_phases())
        except BaseException as error:  # handed to the test's thread
            outcome.append(error)

    thread = threading.Thread(target=node_0, daemon=True)
    thread.start()
    try:
        wait_until(attempt.head.exists, 120, "node 0 to publish the head's address")
        phases = {(line["phase"], line["event"]) for line in read_phases(attempt.phases(0))}
        assert ("launch", "start") in phases and ("ray", "done") not in phases
        assert bootstrap.children.ray is not None
        head = orjson.loads(attempt.head.read_bytes())
        gcs = (
            bootstrap.children.ray.ports.ray_gcs
        )  # where the head's GCS listens: the address joined
        # cluster-tiny's bootstrap.node_address: the head on loopback, on this host
        assert head == {"address": f"127.0.0.2:{gcs}", "host": "host"}
        assert f"--port={gcs}" in bootstrap.children.ray.command()
    finally:
        write_json(attempt.end, {"stopped": "test"})
        thread.join(60)
        bootstrap._stop_children()
    assert len(outcome) == 1 and isinstance(outcome[0], Stopping)


BEFORE_RAY = """
import pickle
import sys
from pathlib import Path
from slurm.bootstrap import NodeBootstrap
from slurm.node.environment import NodeInfo
job = pickle.loads(Path(sys.argv[1]).read_bytes())  # what submitit's task does first
bootstrap = NodeBootstrap(job.config, NodeInfo("4714", 1, 2, "host", "n2", 0, 2))
bootstrap.backend.environment("127.0.0.1")
bootstrap.backend.services()
print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
"""


def test_a_node_starts_its_ray_before_importing_the_trainers_libraries(tmp_path: Path) -> None:
    """Everything a node imports before it launches Ray delays its Ray: the local backend
    imported its data module (numpy, the search index's bm25s: a second of a loaded node's
    start) on every node, though only node 0 prepares the data, after its Ray is launched.
    A node gets its config as submitit's pickle of the NodeJob: unpickled, the config's
    checks (the [services.*] tables parsed by the servers' own configs, which import the
    search index's libraries) do not run again; they ran where the job was submitted."""
    config = load_experiment(TINY, [f'run.folder="{tmp_path / "run"}"'])
    job = tmp_path / "job.pkl"
    job.write_bytes(pickle.dumps(NodeJob(config)))
    result = subprocess.run(
        [sys.executable, "-c", BEFORE_RAY, str(job)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    loaded = set(result.stdout.split())
    assert {"slurm", "deepdive", "services"} <= loaded  # the probe saw the bootstrap's imports
    assert not loaded & {"numpy", "bm25s", "torch", "transformers", "ray", "httpx"}
