"""One node's Ray: `ray start --block` on the node's planned ports, under a keeper
(slurm.node.ray_keeper) that stops it, copies its session logs into the attempt folder and removes
its temp dir however the job ends.

`--block` keeps `ray start` in the foreground, watching the processes it started and taking
them down with it; Ray shares their fate with it through the kernel (PR_SET_PDEATHSIG), it
shares the keeper's, and the keeper ours, so a bootstrap killed by SIGKILL still leaves no Ray
behind. Ray runs in a process group of its own and is stopped by that group, never with
`ray stop --force` (which kills every Ray process on the host, another job's too). Each node
has a custom resource, `deepdive_node_K`, that places work on that node: emulated nodes on
one host register with the same IP, so the IP cannot tell them apart.

Ray's log monitor runs on every node: what an actor prints (and its traceback) reaches the
driver's console, on node 0 the trainer's, so node-0.log shows it while the job runs.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from services.base.errors import RuntimeFailure
from services.base.process import child_preexec, log_tail, terminate
from services.base.waiting import WaitTimeout, wait_for
from slurm.node.ports import NodePorts
from slurm.node.ray_keeper import end_group

STARTED = "Ray runtime started."
# What a Ray worker writes (worker-*.err in the session's logs) when the node's worker port
# range is used up: it cannot register, the raylet starts another, and actors wait forever.
NO_WORKER_PORT = "No available ports"
# What every Ray process of a job runs with (Ray's nodes, so every actor, and the trainer):
# - no drain on SIGTERM: it waits up to 30 s for Ray Serve proxies a job has none of, longer
#   than Slurm's KillWait, so Ray outlived the job and its temp dir stayed
# - no stack dump on SIGTERM: Ray's C++ failure handler prints a trace for every SIGTERM Slurm
#   sends on a cancel or requeue; crashes still dump Python's (faulthandler, on in every worker)
# - actors' lines forwarded to the driver's console without colour codes (it is a log file)
RAY_ENVIRONMENT = {
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "1",
    "RAY_COLOR_PREFIX": "0",
}


# How long a joining node's `ray start` keeps trying the head's GCS: Ray's connect attempts
# (each a second or more; ray/_private/node.py, _init_gcs_client). Ray's default, 20, would
# give up on a head still starting on a loaded node, and a node starts its Ray as soon as it
# knows the head's address, not once the head is up.
HEAD_WAIT_ENV = "RAY_gcs_server_port_wait_time_s"


def node_resource(node: int) -> str:
    """The custom resource that pins work to node `node` (one unit per node)."""
    return f"deepdive_node_{node}"


class RayStartError(RuntimeFailure):
    code = "ray_start_failed"


class RayNode:
    def __init__(
        self,
        *,
        node: int,
        node_ip: str,
        ports: NodePorts,
        head_address: str | None,
        temp_dir: Path,
        log_path: Path,
        logs_to: Path,
        num_cpus: int,
        num_gpus: int,
        environment: dict[str, str],
        head_wait_s: float = 300.0,
    ) -> None:
        self.node = node
        self.node_ip = node_ip
        self.ports = ports
        self.head_address = head_address  # None: this node is the head
        self.temp_dir = temp_dir
        self.log_path = log_path
        self.logs_to = logs_to  # where the keeper copies Ray's session logs at the end
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.environment = environment
        self.head_wait_s = head_wait_s
        self.process: subprocess.Popen[bytes] | None = None  # the keeper
        self._worker_logs_read: dict[str, int] = {}

    @property
    def address(self) -> str:
        """The GCS address other nodes (and drivers) join."""
        return self.head_address or f"{self.node_ip}:{self.ports.ray_gcs}"

    def command(self) -> list[str]:
        ports = self.ports
        head = [f"--port={ports.ray_gcs}"]
        if _has_ray_client():  # else Ray starts no client server (and refuses the flag)
            head.append(f"--ray-client-server-port={ports.ray_client}")
        role = (
            ["--head", *head, "--include-dashboard=false"]
            if self.head_address is None
            else [f"--address={self.head_address}"]
        )
        return [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            *role,
            f"--node-ip-address={self.node_ip}",
            f"--node-manager-port={ports.ray_node_manager}",
            f"--object-manager-port={ports.ray_object_manager}",
            f"--runtime-env-agent-port={ports.ray_runtime_env_agent}",
            f"--dashboard-agent-grpc-port={ports.ray_dashboard_agent_grpc}",
            f"--dashboard-agent-listen-port={ports.ray_dashboard_agent_listen}",
            f"--metrics-export-port={ports.ray_metrics_export}",
            f"--min-worker-port={ports.ray_min_worker}",
            f"--max-worker-port={ports.ray_max_worker}",
            f"--num-cpus={self.num_cpus}",
            f"--num-gpus={self.num_gpus}",
            f"--resources={json.dumps({node_resource(self.node): 1})}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
        ]

    def keeper_command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "slurm.node.ray_keeper",
            f"--temp-dir={self.temp_dir}",
            f"--logs-to={self.logs_to}",
            "--",
            *self.command(),
        ]

    def launch(self) -> None:
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        environment = {
            **os.environ,
            **self.environment,
            **RAY_ENVIRONMENT,
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        environment.pop("RAY_ADDRESS", None)
        if self.head_address is not None:
            environment[HEAD_WAIT_ENV] = str(math.ceil(self.head_wait_s))
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(  # noqa: S603 (ray's own CLI, fixed arguments)
                self.keeper_command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,  # its own process group, and Ray's is another
                preexec_fn=child_preexec,
            )

    def wait_started(self, timeout_s: float, check: Callable[[], None] | None = None) -> None:
        """Block until `ray start` reports the node up (registered with the head's GCS)."""

        def checks() -> None:
            if not self.alive():
                raise RayStartError(
                    f"ray start exited with status {self.returncode()}; its log "
                    f"({self.log_path}) ends with:\n{self.log_tail()}"
                )
            if check is not None:
                check()

        try:
            wait_for(self._started, timeout_s=timeout_s, what="ray start", check=checks)
        except WaitTimeout:
            raise RayStartError(
                f"Ray did not start within {timeout_s:g} s; its log ({self.log_path}) ends "
                f"with:\n{self.log_tail()}"
            ) from None

    def _started(self) -> bool:
        try:
            return STARTED in self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def log_tail(self) -> str:
        return log_tail(self.log_path)

    def worker_port_exhaustion(self) -> str | None:
        """Why actors on this node never start, when Ray's workers say they found no free
        port in the node's range (read from the session's worker logs on local disk, only
        what was added since the last call); None while none did."""
        logs = self.temp_dir / "session_latest" / "logs"
        try:
            candidates = [path for path in logs.iterdir() if path.name.startswith("worker-")]
        except OSError:
            return None
        for path in candidates:
            if not path.name.endswith(".err"):
                continue
            offset = self._worker_logs_read.get(path.name, 0)
            try:
                with path.open("rb") as handle:
                    handle.seek(offset)
                    added = handle.read()
            except OSError:
                continue
            self._worker_logs_read[path.name] = offset + len(added)
            if NO_WORKER_PORT.encode() in added:
                ports = self.ports
                return (
                    f"Ray ran out of worker ports: every Ray worker holds one port of the "
                    f"node's range {ports.ray_min_worker}-{ports.ray_max_worker} "
                    f"({ports.worker_ports} ports, for {self.num_cpus} CPUs and "
                    f"{self.num_gpus} GPUs) and none was free, so actors started now would "
                    f"wait forever (Ray's worker log {path.name}: {NO_WORKER_PORT!r})"
                )
        return None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the keeper (it ends Ray's process group, copies Ray's session logs and
        removes the temp dir); SIGKILL to both groups if it is not done after `timeout_s`."""
        process, self.process = self.process, None
        if process is None:
            return
        terminate(process, timeout_s)
        end_group(process.pid, 0)  # anything left of the keeper's group, at once


def _has_ray_client() -> bool:
    """Ray's own test (ray._private.utils.get_ray_client_dependency_error): with grpc installed
    a head serves Ray Client, on port 10001 unless told otherwise, and two heads on one host
    would collide there."""
    return importlib.util.find_spec("grpc") is not None
