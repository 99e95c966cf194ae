"""`deepdive status` on a run folder as a job leaves it (no Slurm needed: the folder is the
record), in words and as JSON."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson

from slurm.node.phases import PhaseLog
from tests.helpers import DEEPDIVE


def test_status_as_json_names_each_node(tmp_path: Path) -> None:
    run = tmp_path / "run"
    attempt = run / "attempts" / "7-0"
    attempt.mkdir(parents=True)
    (run / "config.toml").write_text('[run]\nfolder = "x"\n')
    (run / "jobs.jsonl").write_bytes(orjson.dumps({"job_id": "7", "t": 0, "nodes": 2}) + b"\n")
    for node in (0, 1):
        PhaseLog(attempt / f"node-{node}.phases.jsonl", node, "7-0").record("services", "start")
    # Slurm's answer from a squeue of our own: the machine's may be unconfigured (a failing
    # scontrol is a SchedulerError now, tests/slurm/test_scheduler_failures.py)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\necho RUNNING\n")
    (bin_dir / "squeue").chmod(0o755)
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PATH": str(bin_dir)}
    result = subprocess.run(
        [*DEEPDIVE, "status", str(run), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    status = orjson.loads(result.stdout)
    assert status["nodes"] == {"0": "services start", "1": "services start"}
    assert status["attempt"] == "7-0" and status["job_id"] == "7"
    assert status["state"] == "RUNNING"
