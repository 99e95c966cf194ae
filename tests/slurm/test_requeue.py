"""A requeue that works inside an image (slurm/requeue.py), its pieces without a cluster: the
stand-in `scontrol` every task finds first on its PATH, the batch script's lines around srun
(run by bash as the rendered sbatch script has them), the warning signal, and what `deepdive
status` does with the notes (node 0 waiting for its peers to stop: tests/slurm/test_watch.py).
The whole path runs with real Slurm in tests/slurm/test_jobs.py (no image) and
tests/two_hosts (inside the SIF, on two hosts)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from slurm import requeue
from slurm.config import load_experiment
from slurm.launch.submit import executor_parameters, sbatch_script
from slurm.launch.task_command import python_command
from slurm.node.phases import PhaseLog
from slurm.run_folder import RunFolder
from slurm.view.status import run_status
from tests.helpers import DEEPDIVE

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "cluster-tiny.toml"
JOB = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "1"}


def host_scontrol(folder: Path, code: int = 0, says: str = "") -> Path:
    """A `scontrol` standing for the host's Slurm client: it appends its arguments to
    calls.txt, prints `says` on stderr and exits `code`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "says.txt").write_text(says)
    path = folder / "scontrol"
    path.write_text(
        f'#!/bin/sh\necho "$*" >> {folder}/calls.txt\ncat {folder}/says.txt >&2\nexit {code}\n'
    )
    path.chmod(0o755)
    return folder / "calls.txt"


def stand_in(tmp_path: Path) -> tuple[RunFolder, Path]:
    run = RunFolder(tmp_path / "run")
    return run, requeue.write_stand_in(run)


def run_stand_in(
    script: Path, *args: str, path: str = "/usr/bin:/bin", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script), *args],
        env={"PATH": path, **JOB, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_stand_in_notes_its_own_jobs_requeue_in_the_attempt_folder(tmp_path: Path) -> None:
    """submitit's call, `scontrol requeue 7`, from job 7's task in its second attempt."""
    run, script = stand_in(tmp_path)
    result = run_stand_in(script, "requeue", "7")
    assert result.returncode == 0, result.stderr
    note = orjson.loads(run.attempt("7-1").requeue_asked.read_bytes())
    assert (note["job_id"], note["restart_count"]) == ("7", 1)
    assert isinstance(note["t"], int)
    assert "requeue of job 7 asked" in result.stderr


@pytest.mark.parametrize(
    "args", [("requeue", "8"), ("requeue",), ("requeue", "7", "extra"), ("show", "job", "7")]
)
def test_anything_else_goes_to_a_real_scontrol_further_on_the_path(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    run, script = stand_in(tmp_path)
    calls = host_scontrol(tmp_path / "slurm")
    path = f"{script.parent}:{tmp_path / 'slurm'}:/usr/bin:/bin"
    result = run_stand_in(script, *args, path=path)
    assert result.returncode == 0, result.stderr
    assert calls.read_text() == " ".join(args) + "\n"
    assert not run.attempts.exists()  # no requeue noted


def image_tools(folder: Path) -> Path:
    """A PATH folder with what the stand-in uses and no scontrol: an image's."""
    folder.mkdir()
    for tool in ("dirname", "date", "mkdir", "mv"):
        found = shutil.which(tool)
        assert found, tool
        (folder / tool).symlink_to(found)
    return folder


def test_without_a_real_scontrol_the_stand_in_says_so(tmp_path: Path) -> None:
    """Inside an image: no Slurm client. The stand-in's own folder twice on the PATH (or
    through a symlink) is not taken for a real one."""
    run, script = stand_in(tmp_path)
    tools = image_tools(tmp_path / "tools")
    (tmp_path / "link").symlink_to(script.parent)
    path = f"{script.parent}:{tmp_path / 'link'}:{script.parent}:{tools}"
    result = run_stand_in(script, "show", "job", "7", path=path)
    assert result.returncode == 127
    assert "no Slurm client here" in result.stderr
    result = run_stand_in(script, "requeue", "7", path=path, env={"SLURM_JOB_ID": ""})
    assert result.returncode == 127  # outside a job nothing is noted
    assert not run.attempts.exists()
    assert run_stand_in(script, "requeue", "7", path=path).returncode == 0  # the image's tools do


def batch_script(tmp_path: Path, task: str) -> tuple[RunFolder, str]:
    """The rendered sbatch script's setup and teardown lines around `task` (what srun ran),
    as bash runs them on the job's first node; the stand-in written as `deepdive submit`
    writes it."""
    config = load_experiment(TINY, [f'run.folder="{tmp_path / "run"}"'])
    run = config.run_folder
    requeue.write_stand_in(run)
    lines = sbatch_script(config).splitlines()
    setup = lines[lines.index("# setup") + 1 : lines.index("# command")]
    teardown = lines[lines.index("# teardown") + 1 :]
    return run, "\n".join([*setup, task, *teardown])


def run_batch(tmp_path: Path, script: str, host: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script],
        env={"PATH": f"{host}:/usr/bin:/bin", **JOB},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_batch_script_requeues_after_srun_with_the_hosts_scontrol(tmp_path: Path) -> None:
    """The task's `scontrol requeue` reaches the stand-in (first on the PATH the batch script
    exports); after the task, the batch script calls the host's scontrol once, and writes
    Slurm's answer beside the request."""
    calls = host_scontrol(tmp_path / "slurm")
    task = 'scontrol requeue "$SLURM_JOB_ID" && test ! -e ' + str(calls)  # not called yet
    run, script = batch_script(tmp_path, task + "; (exit 255)")  # submitit's sys.exit(-1)
    result = run_batch(tmp_path, script, tmp_path / "slurm")
    assert result.returncode == 255, result.stderr
    assert calls.read_text() == "requeue 7\n"
    answer = orjson.loads(run.attempt("7-1").requeue_answer.read_bytes())
    assert answer["requeued"] is True and isinstance(answer["t"], int)
    assert run_status(run).requeue == (
        "requeued by Slurm: the next attempt starts when Slurm runs the job again"
    )


@pytest.mark.parametrize("code", [0, 1, 137])
def test_no_request_no_requeue_and_the_job_ends_with_sruns_status(
    tmp_path: Path, code: int
) -> None:
    """A job that ends (or fails) without submitit asking: the host's scontrol is not called,
    and the batch script exits with srun's status (a failed job stays FAILED in Slurm)."""
    calls = host_scontrol(tmp_path / "slurm")
    run, script = batch_script(tmp_path, f"echo training; (exit {code})")
    result = run_batch(tmp_path, script, tmp_path / "slurm")
    assert result.returncode == code, result.stderr
    assert not calls.exists()
    assert not run.attempt("7-1").requeue_answer.exists()


def test_slurms_refusal_is_written_whole_and_shown_by_status(tmp_path: Path) -> None:
    says = 'Requeue of JobId=7 returned an error: "Job\\is not\trequeueable"\nsecond line'
    calls = host_scontrol(tmp_path / "slurm", code=1, says=says)
    run, script = batch_script(tmp_path, 'scontrol requeue "$SLURM_JOB_ID"')
    result = run_batch(tmp_path, script, tmp_path / "slurm")
    assert calls.read_text() == "requeue 7\n"
    answer = orjson.loads(run.attempt("7-1").requeue_answer.read_bytes())
    assert answer["requeued"] is False
    assert answer["error"] == says.replace("\t", " ")
    assert "Slurm refused to requeue job 7" in result.stderr
    assert run_status(run).requeue == f"REFUSED by Slurm: {answer['error']}"


def test_status_shows_a_requeue_asked_and_not_yet_made(tmp_path: Path) -> None:
    run, script = stand_in(tmp_path)
    (run.root / "config.toml").write_text('[run]\nfolder = "x"\n')
    assert run_stand_in(script, "requeue", "7").returncode == 0
    PhaseLog(run.attempt("7-1").phases(0), 0, "7-1").record("job", "children_stopped")
    result = subprocess.run(
        [*DEEPDIVE, "status", str(run.root)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    assert result.returncode == 0, result.stderr
    assert (
        "requeue   asked: the batch script requeues the job once every node has stopped"
        in result.stdout
    )


def test_the_warning_signal_is_sigurg_by_number_for_sbatch_and_by_name_for_submitit(
    tmp_path: Path,
) -> None:
    """Slurm 22.05 knows no name URG (its table ends at XCPU); submitit looks the name up as
    signal.SIG<name>. SIGURG's default action is to ignore it: squashfuse survives it."""
    config = load_experiment(TINY, [f'run.folder="{tmp_path}"'])
    delay = config.slurm.signal_delay_s
    assert executor_parameters(config)["additional_parameters"]["signal"] == f"23@{delay}"
    assert f"#SBATCH --signal=23@{delay}" in sbatch_script(config).splitlines()
    assert getattr(signal, "SIG" + requeue.SIGNAL_NAME) == signal.SIGURG
    assert int(signal.SIGURG) == 23  # x86_64, aarch64, ppc64le: the number sbatch gets
    assert signal.getsignal(signal.SIGURG) == signal.SIG_DFL  # Python leaves it alone
    assert f"export SUBMITIT_PREEMPT_SIGNAL={requeue.SIGNAL_NAME}" in sbatch_script(config)


def test_inside_an_image_the_tasks_get_the_signal_and_the_stand_in_with_env(
    tmp_path: Path,
) -> None:
    """The batch script's exports reach the image through Apptainer's default environment;
    --env says it explicitly (an image's own environment scripts cannot drop it), and
    PREPEND_PATH puts the stand-in before the image's own PATH (Apptainer 1.4)."""
    config = load_experiment(
        TINY,
        [
            f'run.folder="{tmp_path / "run"}"',
            f'container.image="{tmp_path / "x.sif"}"',
            'container.options=["--contain"]',
        ],
    )
    command = python_command(config).split()
    env = [command[i + 1] for i, word in enumerate(command) if word == "--env"]
    assert env == [
        "SUBMITIT_PREEMPT_SIGNAL=URG",
        f"PREPEND_PATH={tmp_path / 'run' / 'submitit' / 'bin'}",
    ]
    assert command.index("--contain") > command.index("--env")


def test_usr2_does_what_the_warning_signal_does_in_the_job() -> None:
    """`scancel --signal=USR2` (submitit's docs) still reaches submitit's handler, installed
    for SIGURG; without that, USR2's default action would end node 0's bootstrap."""
    code = (
        "import os, signal\n"
        "from slurm import requeue\n"
        "seen = []\n"
        "signal.signal(signal.SIGURG, lambda number, frame: seen.append(number))\n"
        "requeue.answer_usr2_too()\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "print(seen)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"[{int(signal.SIGUSR2)}]"
