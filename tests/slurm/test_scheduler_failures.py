"""Slurm's client commands missing or failing are facts of this machine, not the user's input:
`deepdive status` and `deepdive cancel` say so in one line and exit 1 (a SchedulerError), not 2
(a ConfigError, the user's to fix), and never with a traceback. The commands are real: a PATH
holding only the Slurm commands each case gives it, as small scripts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.helpers import DEEPDIVE


def run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[run]\nfolder = "x"\n')
    (run / "jobs.jsonl").write_bytes(orjson.dumps({"job_id": "7", "t": 0, "nodes": 1}) + b"\n")
    return run


def deepdive(
    tmp_path: Path, commands: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """`deepdive ARGS` with a PATH of only `commands` (name: the script's body)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in commands.items():
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    env = {**os.environ, "PATH": str(bin_dir), "XDG_STATE_HOME": str(tmp_path / "state")}
    return subprocess.run(
        [*DEEPDIVE, *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


DENIED = "echo 'scancel: error: Kill job error on job id 7: Access/permission denied' >&2; exit 1"
DOWN = "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2"
# what scontrol says on a machine with Slurm installed but no configuration: its last line
UNCONFIGURED = (
    "echo 'scontrol: error: fetch_config: DNS SRV lookup failed' >&2; "
    "echo 'scontrol: fatal: Could not establish a configuration source' >&2; exit 1"
)


@pytest.mark.parametrize(
    ("commands", "args", "said"),
    [
        (
            {"scancel": DENIED},
            ["cancel"],
            "deepdive: error: scancel 7: scancel: error: Kill job error on job id 7: "
            "Access/permission denied",
        ),
        ({}, ["cancel"], "deepdive: error: scancel is not on PATH: is this a Slurm login node?"),
        ({}, ["status"], "deepdive: error: squeue is not on PATH: is this a Slurm login node?"),
        (
            {"squeue": DOWN + "; exit 1", "scontrol": DOWN + "; exit 1"},
            ["status"],
            "deepdive: error: scontrol show job 7: slurm_load_jobs error: Unable to contact "
            "slurm controller (connect failure)",
        ),
        (
            {"squeue": "exit 1", "scontrol": UNCONFIGURED},
            ["status"],
            "deepdive: error: scontrol show job 7: scontrol: fatal: Could not establish a "
            "configuration source",
        ),
        ({"scancel": "exit 3"}, ["cancel"], "deepdive: error: scancel 7: exit status 3"),
    ],
    ids=[
        "scancel-fails",
        "no-scancel",
        "no-squeue",
        "controller-down",
        "unconfigured",
        "scancel-silent",
    ],
)
def test_a_slurm_command_missing_or_failing_is_one_line_and_exit_1(
    tmp_path: Path, commands: dict[str, str], args: list[str], said: str
) -> None:
    result = deepdive(tmp_path, commands, *args, str(run_folder(tmp_path)))
    assert one_line(result) == said
    assert result.returncode == 1


def test_a_job_slurm_has_forgotten_is_a_state_not_a_failure(tmp_path: Path) -> None:
    forgotten = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"
    commands = {"squeue": "exit 0", "scontrol": forgotten}
    result = deepdive(tmp_path, commands, "status", str(run_folder(tmp_path)), "--json")
    assert result.returncode == 0, result.stderr
    assert orjson.loads(result.stdout)["state"] is None


def test_the_users_own_mistake_stays_exit_2(tmp_path: Path) -> None:
    result = deepdive(tmp_path, {}, "cancel", str(tmp_path / "nothing-here"))
    assert one_line(result).startswith("deepdive: error: ")
    assert result.returncode == 2
