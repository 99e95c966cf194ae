"""One node's Ray: `ray start --block` as a child process, on the node's planned ports.

`--block` keeps `ray start` in the foreground, watching the processes it started and taking
them down with it; Ray shares their fate with it through the kernel (PR_SET_PDEATHSIG), and we
share its fate with us the same way, so a bootstrap killed by SIGKILL still leaves no Ray
behind. It runs in a process group of its own and is stopped by that group, never with
`ray stop --force` (which kills every Ray process on the host, another job's too). Each node
has a custom resource, `deepdive_node_K`, that places work on that node: emulated nodes on
one host register with the same IP, so the IP cannot tell them apart.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from services.exceptions import ServiceError
from services.process import child_preexec, log_tail
from services.waiting import WaitTimeout, wait_for
from slurm.ports import NodePorts

STARTED = "Ray runtime started."


def node_resource(node: int) -> str:
    """The custom resource that pins work to node `node` (one unit per node)."""
    return f"deepdive_node_{node}"


class RayStartError(ServiceError):
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
        num_cpus: int,
        num_gpus: int,
        environment: dict[str, str],
    ) -> None:
        self.node = node
        self.node_ip = node_ip
        self.ports = ports
        self.head_address = head_address  # None: this node is the head
        self.temp_dir = temp_dir
        self.log_path = log_path
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.environment = environment
        self.process: subprocess.Popen[bytes] | None = None

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
            # no log monitor (about 1 s of every node's start): workers' output stays in Ray's
            # session logs; their errors still reach the trainer, as exceptions
            "--include-log-monitor=false",
        ]

    def launch(self) -> None:
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        environment = {**os.environ, **self.environment, "RAY_USAGE_STATS_ENABLED": "0"}
        environment.pop("RAY_ADDRESS", None)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(  # noqa: S603 (ray's own CLI, fixed arguments)
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,  # its own process group: stopped as one
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

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM to the process group (ray start shuts its processes down), SIGKILL to
        whatever of the group is left after `timeout_s`."""
        process, self.process = self.process, None
        if process is None:
            return
        group = process.pid
        _signal_group(group, signal.SIGTERM)
        with contextlib.suppress(WaitTimeout):
            wait_for(
                lambda: not _group_alive(group),
                timeout_s=timeout_s,
                what="ray's processes to exit",
            )
        _signal_group(group, signal.SIGKILL)  # whatever of the group is left
        process.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # sockets and session logs


def _has_ray_client() -> bool:
    """Ray's own test (ray._private.utils.get_ray_client_dependency_error): with grpc installed
    a head serves Ray Client, on port 10001 unless told otherwise, and two heads on one host
    would collide there."""
    return importlib.util.find_spec("grpc") is not None


def _signal_group(group: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, number)


def _group_alive(group: int) -> bool:
    """Whether any process of the group still runs (zombies do not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == group and state != "Z":
            return True
    return False
