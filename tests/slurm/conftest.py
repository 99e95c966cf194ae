"""The Slurm tests' cluster: a private 2-node Slurm on this host, started once for the session
by the project's own script (scripts/local-slurm.sh) and stopped after. Where Slurm is not
installed (and cannot be: `make test` installs it as root), the tests that need it skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import LOCAL_SLURM, slime_world

# Its own daemons and ports, beside a dev cluster; two checkouts testing at once on one host
# (worktrees) give each its own with DEEPDIVE_TEST_SLURM=DIR:CTLD_PORT:SLURMD_PORT0.
CLUSTER_DIR, CTLD_PORT, SLURMD_PORT0 = os.environ.get(
    "DEEPDIVE_TEST_SLURM", "/tmp/deepdive-slurm-tests:16827:16950"
).split(":")


@pytest.fixture(scope="session")
def slurm_env() -> Iterator[dict[str, str]]:
    """The environment in which `deepdive submit` and Slurm's commands reach the cluster."""
    if os.environ.get("DEEPDIVE_SKIP_SLURM"):
        pytest.skip("DEEPDIVE_SKIP_SLURM is set (make test-fast): no Slurm cluster is started")
    missing = [
        name for name in ("slurmctld", "slurmd", "munged", "sbatch") if not shutil.which(name)
    ]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} missing); as root, "
            "`scripts/local-slurm.sh install` installs it (make test does)"
        )
    env = {
        **os.environ,
        "DEEPDIVE_SLURM_DIR": CLUSTER_DIR,
        "CTLD_PORT": CTLD_PORT,
        "SLURMD_PORT0": SLURMD_PORT0,
    }
    up = subprocess.run(
        [str(LOCAL_SLURM), "up"], env=env, capture_output=True, text=True, timeout=180
    )
    assert up.returncode == 0, up.stdout + up.stderr
    env["SLURM_CONF"] = str(Path(CLUSTER_DIR) / "slurm.conf")
    yield env
    subprocess.run([str(LOCAL_SLURM), "down"], env=env, capture_output=True, timeout=180)


@pytest.fixture
def job_env(slurm_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The cluster's environment, with the CLI's job index kept in this test's folder."""
    return {**slurm_env, "XDG_STATE_HOME": str(tmp_path / "state")}


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """The files configs/deepdive-qwen.toml names (tests.helpers.slime_world), made here."""
    return slime_world(tmp_path)
