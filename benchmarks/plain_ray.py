"""The job the start-up benchmark holds the launcher against: what a Slurm user writes from
submitit's documentation and Ray's Slurm guide, with no launcher. Each task starts
`ray start --block` at once: node 0 the head on a fixed port, the others joining it (Ray's own
retry waits for the head's GCS, and the task starts Ray again if that runs out). Each notes
when its Ray node is up ("Ray runtime started."), waits until every node's is, and stops it.
No services, no trainer: the fastest a job can have every node in Ray.

Ports: a fixed port, as the guide's 6379, would collide between emulated nodes on one host
(and with other jobs there), so each node takes its block of the launcher's port plan without
checking it (slurm.node.ports imports in milliseconds). Only the standard library and slurm.node.ports
are imported before Ray starts, so the task's Python start is as short as a script's.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from slurm.node.ports import candidate_blocks
from slurm.node.process_start import process_started_at

STARTED = "Ray runtime started."
JOIN_TIMEOUT_S = 120.0


class PlainRayNode:
    """submitit's callable (a class at module level, so the pickle names this module only)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self) -> dict[str, Any]:
        import submitit  # already loaded by submitit's runner: costs nothing here

        started = process_started_at()
        job = submitit.JobEnvironment()
        node, nodes = job.global_rank, job.num_nodes
        folder = Path(self.folder)
        joined = start_ray(job.job_id, node, nodes, head_ip(job.hostnames[0]))
        note = {"node": node, "process_started": started, "ray_started": joined[0]}
        write_note(folder / f"node-{node}.json", note)
        try:
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            while not all((folder / f"node-{k}.json").exists() for k in range(nodes)):
                if time.monotonic() > deadline:
                    raise TimeoutError("the other nodes' Ray did not start")
                time.sleep(0.1)
        finally:
            stop_ray(*joined[1:])
        return note


def head_ip(head_host: str) -> str:
    """The head's address, as the guide finds it (its host's address); emulated nodes named
    n1, n2 resolve nowhere, and share this host: then this host's."""
    try:
        return socket.gethostbyname(head_host)
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def start_ray(
    job_id: str, node: int, nodes: int, ip: str
) -> tuple[float, subprocess.Popen[bytes], Path]:
    """`ray start --block` until its node is up: when, the process, its temp dir."""
    ports = next(candidate_blocks(job_id, node, nodes))
    head_port = next(candidate_blocks(job_id, 0, nodes)).ray_gcs
    temp = Path(tempfile.mkdtemp(prefix=f"ddp-{job_id}-{node}-", dir="/tmp"))
    head = ["--head", f"--port={head_port}", "--include-dashboard=false"]
    if importlib.util.find_spec("grpc") is not None:  # else Ray serves no client (see ray_cluster)
        head.append(f"--ray-client-server-port={ports.ray_client}")
    role = head if node == 0 else [f"--address={ip}:{head_port}"]
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--block",
        *role,
        f"--node-ip-address={ip}",
        f"--node-manager-port={ports.ray_node_manager}",
        f"--object-manager-port={ports.ray_object_manager}",
        f"--runtime-env-agent-port={ports.ray_runtime_env_agent}",
        f"--dashboard-agent-grpc-port={ports.ray_dashboard_agent_grpc}",
        f"--dashboard-agent-listen-port={ports.ray_dashboard_agent_listen}",
        f"--metrics-export-port={ports.ray_metrics_export}",
        f"--min-worker-port={ports.ray_min_worker}",
        f"--max-worker-port={ports.ray_max_worker}",
        "--num-cpus=1",
        f"--resources={json.dumps({f'node_{node}': 1})}",
        f"--temp-dir={temp}",
        "--disable-usage-stats",
    ]
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while True:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        )
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.buffer.write(line)
            if STARTED.encode() in line:
                sys.stdout.flush()
                return time.time(), process, temp
        process.wait()
        if node == 0 or time.monotonic() > deadline:  # the head failed, or never answered
            raise RuntimeError(f"ray start exited with status {process.returncode}")


def stop_ray(process: subprocess.Popen[bytes], temp: Path) -> None:
    """SIGTERM to Ray's process group (never `ray stop`: it ends every Ray on the host)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    shutil.rmtree(temp, ignore_errors=True)


def write_note(path: Path, note: dict[str, Any]) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(note))
    partial.rename(path)


def submit(folder: Path) -> str:
    """sbatch the plain job through submitit as the launcher's job is sent (2 nodes, one task
    each, cluster-tiny's CPUs and memory); its id."""
    import submitit

    executor = submitit.SlurmExecutor(folder=folder / "submitit" / "%j", python=sys.executable)
    executor.update_parameters(
        job_name="plain-ray", nodes=2, ntasks_per_node=1, cpus_per_task=1, mem="2560MB", time=10
    )
    return str(executor.submit(PlainRayNode(str(folder))).job_id)


if __name__ == "__main__":
    print(f"submitted job {submit(Path(sys.argv[1]))}")
