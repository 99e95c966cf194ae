"""What `deepdive submit` leaves behind when sbatch refuses the job, on the real Slurm of the
Slurm tests: one line with Slurm's reason, and the run folder as it was."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.helpers import DEEPDIVE, tiny_job


def submit(arguments: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEEPDIVE, "submit", *arguments], env=env, capture_output=True, text=True, timeout=120
    )


def test_a_refused_job_says_why_in_one_line_and_leaves_no_folder(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    refused = submit(tiny_job(run, 1, 'slurm.partition="no-such-partition"'), job_env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr  # no traceback, sbatch's words said once
    assert lines[0].startswith("deepdive: error: sbatch refused the job: ")
    assert "partition" in lines[0].lower()
    assert not run.exists()


def test_a_refused_resubmission_keeps_the_folder_as_it_was(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    (run / "submitit" / "41").mkdir(parents=True)
    kept = run / "submitit" / "41" / "41_submitted.pkl"
    kept.write_bytes(b"an earlier job's pickle")
    refused = submit(tiny_job(run, 1, 'slurm.partition="no-such-partition"'), job_env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    left = sorted(str(path.relative_to(run)) for path in run.rglob("*"))
    assert left == ["submitit", "submitit/41", "submitit/41/41_submitted.pkl"]
    assert kept.read_bytes() == b"an earlier job's pickle"
