"""The 2-host container cluster (scripts/two-hosts.sh): three podman containers on a network of
their own, ctl (slurmctld, the login host) and the nodes n1 and n2 (slurmd, Apptainer). These
tests run only where that script has brought it up and says where (DEEPDIVE_TWO_HOSTS: its
cluster.env); `make ci-two-hosts`, run by .ci/run, does. Elsewhere they skip, saying so."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ENV = "DEEPDIVE_TWO_HOSTS"
USER = "ci"  # uid 1000 on every host: Apptainer runs inside podman only as a non-root user
CONFIG = "/src/configs/cluster-tiny.toml"  # the checkout, bound read-only on ctl
HOST_NUMBERS = {"ctl": 10, "n1": 11, "n2": 12}  # each host's address in the cluster's /24


@dataclass(frozen=True)
class TwoHosts:
    prefix: str
    net: str  # the /24's first three numbers
    sif: str  # the CPU SIF, at the same path on every host
    shared: Path  # the shared volume, as this host sees it (/shared in the containers)
    logs: Path  # Slurm's logs, a folder per host

    def address(self, host: str) -> str:
        return f"{self.net}.{HOST_NUMBERS[host]}"

    def run(
        self, host: str, *command: str, user: str | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`command` on `host` (a container of the cluster), as root or `user`."""
        who = ["--user", user, "--workdir", f"/home/{user}"] if user else []
        return subprocess.run(
            ["podman", "exec", "-i", *who, f"{self.prefix}-{host}", *command],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def slurm(self, *command: str) -> str:
        result = self.run("ctl", *command, user=USER)
        assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
        return result.stdout

    def in_queue(self, job_id: str) -> bool:
        return bool(self.slurm("squeue", "-h", "-j", job_id, "-o", "%T").strip())

    def job_fields(self, job_id: str) -> dict[str, str]:
        out = self.slurm("scontrol", "-o", "show", "job", job_id)
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def slurm_logs(self) -> str:
        """Every host's Slurm log, for a failure's message."""
        return "\n".join(
            f"== {path}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.logs.glob("*/*.log"))
        )


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `condition` until it holds; the seconds it took."""
    started = time.monotonic()
    delay = 0.1
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what}: not after {timeout_s} s"
        time.sleep(delay)
        delay = min(0.5, delay * 1.5)
    return time.monotonic() - started


@pytest.fixture(scope="session")
def cluster() -> TwoHosts:
    path = os.environ.get(ENV)
    if not path:
        pytest.skip(f"no 2-host cluster: `make ci-two-hosts` brings one up ({ENV} unset)")
    values = dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line)
    return TwoHosts(
        prefix=values["TWO_HOSTS_PREFIX"],
        net=values["TWO_HOSTS_NET"],
        sif=values["TWO_HOSTS_SIF"],
        shared=Path(values["TWO_HOSTS_SHARED"]),
        logs=Path(values["TWO_HOSTS_LOGS"]),
    )
