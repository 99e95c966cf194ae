"""What `deepdive submit --dry-run` prints is exactly what would run: the sbatch script submitit
renders and the training command, checked against recorded files (golden/), as submitit checks
its own sbatch string against a record. Paths that differ by machine are written {RUN},
{PYTHON} and {IMAGE} in the records."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm import requeue
from slurm.config import load_experiment
from slurm.launch.submit import executor_parameters, sbatch_script
from slurm.launch.task_command import python_command
from slurm.run_folder import RunFolder
from tests.helpers import DEEPDIVE

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
SHIPPED = ROOT / "configs" / "cluster-local.toml"


def dry_run(cwd: Path, *args: str) -> str:
    result = subprocess.run(
        [*DEEPDIVE, "submit", str(SHIPPED), "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def placeholders(text: str, run: Path, image: Path | None = None) -> str:
    if image is not None:
        text = text.replace(str(image), "{IMAGE}")
    return text.replace(str(run), "{RUN}").replace(sys.executable, "{PYTHON}")


def check(name: str, text: str) -> None:
    record = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):  # to re-record after a deliberate change
        record.write_text(text)
    assert text == record.read_text()


def test_the_dry_run_prints_the_sbatch_script_and_the_command(tmp_path: Path) -> None:
    out = dry_run(tmp_path)
    check("dry_run.txt", placeholders(out, tmp_path / "runs" / "cluster-local"))
    assert not (tmp_path / "runs").exists()  # nothing written, nothing submitted


def test_with_an_image_every_task_runs_inside_it(tmp_path: Path) -> None:
    image = tmp_path / "train.sif"
    image.write_bytes(b"not really an image")
    out = dry_run(
        tmp_path,
        "--set",
        f'container.image="{image}"',
        "--set",
        'container.binds=["/data"]',
        "--nodes",
        "4",
        "--set",
        "slurm.gpus_per_node=8",
        "--set",
        'slurm.partition="gpu"',
        "--set",
        'slurm.extra={"mail-type"="END"}',
    )
    check("dry_run_image.txt", placeholders(out, tmp_path / "runs" / "cluster-local", image))


def test_executor_parameters_are_a_pure_function_of_the_config(tmp_path: Path) -> None:
    config = load_experiment(SHIPPED, [f'run.folder="{tmp_path}"', "slurm.exclusive=true"])
    assert executor_parameters(config) == {
        "job_name": "deepdive-local",
        "nodes": 2,
        "ntasks_per_node": 1,
        "time": 30,
        "signal_delay_s": 90,
        "srun_args": ["--kill-on-bad-exit=1", "--cpus-per-task=2"],
        "cpus_per_task": 2,
        "mem": "4096MB",
        "exclusive": True,
        "setup": requeue.batch_setup(RunFolder(tmp_path)),
        "teardown": requeue.batch_teardown(RunFolder(tmp_path)),
        "additional_parameters": {"requeue": True, "signal": "23@90"},
    }
    assert python_command(config) == sys.executable


@pytest.mark.parametrize(
    ("mem_gb", "exclusive", "sent"),
    [(0, True, "--mem=0"), (0, False, None), (2, True, "--mem=2048MB"), (2, False, "--mem=2048MB")],
)
def test_memory_and_requeue_reach_sbatch(
    tmp_path: Path, mem_gb: int, exclusive: bool, sent: str | None
) -> None:
    """mem_gb = 0 on exclusive nodes is the whole node (--exclusive alone gets the partition's
    default memory per CPU); every job asks for --requeue itself."""
    config = load_experiment(
        SHIPPED,
        [
            f'run.folder="{tmp_path}"',
            f"slurm.mem_gb={mem_gb}",
            f"slurm.exclusive={exclusive}".lower(),
        ],
    )
    script = sbatch_script(config)
    lines = [line for line in script.splitlines() if line.startswith("#SBATCH --mem")]
    assert lines == ([f"#SBATCH {sent}"] if sent else [])
    assert "#SBATCH --requeue" in script.splitlines()


@pytest.mark.parametrize("nv", [True, False])
def test_the_python_command_runs_in_the_image(tmp_path: Path, nv: bool) -> None:
    image = tmp_path / "x.sif"
    image.touch()
    config = load_experiment(
        SHIPPED,
        [
            f'run.folder="{tmp_path / "run"}"',
            f'container.image="{image}"',
            f"container.nv={str(nv).lower()}",
            'container.options=["--contain"]',
        ],
    )
    expected = ["apptainer", "exec", *(["--nv"] if nv else [])]
    expected += ["--bind", str(tmp_path / "run"), "--bind", "/dev/shm"]
    expected += ["--env", "SUBMITIT_PREEMPT_SIGNAL=URG"]  # slurm/requeue.py
    expected += ["--env", f"PREPEND_PATH={tmp_path / 'run' / 'submitit' / 'bin'}", "--contain"]
    assert python_command(config) == " ".join([*expected, str(image), "python3"])


def test_the_recipe_dry_runs_before_anything_is_downloaded_or_built(tmp_path: Path) -> None:
    """No image, env file, model or data yet: the dry run still prints the sbatch script and
    slime's command, then lists what is missing and exits non-zero; the submission refuses."""
    recipe = ROOT / "configs" / "deepdive-qwen.toml"
    relative = ["--set", 'slime.rollout.prompt_data="data/train.jsonl"']
    dry = subprocess.run(
        [*DEEPDIVE, "submit", str(recipe), "--dry-run", *relative],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
    )  # fmt: skip
    assert dry.returncode == 2, dry.stderr
    assert (
        "#SBATCH --nodes=2" in dry.stdout
        and "cd /opt/slime && python3 -m slurm.backends.slime.driver" in dry.stdout
    )
    for flag in ("--attention-dropout 0.0", "--sglang-context-length", "--recompute-granularity"):
        assert flag in dry.stdout, flag
    # relative paths are taken from where you submit (the trainer runs in slime's folder)
    assert f"--prompt-data {tmp_path}/data/train.jsonl" in " ".join(dry.stdout.split())
    missing = [line for line in dry.stderr.splitlines() if line.startswith("missing: ")]
    assert [line.split(":")[1].strip() for line in missing] == [
        "container.image",
        "services.env_file",
        "slime.model.hf_checkpoint",
        "slime.model.ref_load",
        "slime.rollout.prompt_data",
    ]
    assert dry.stderr.strip().splitlines()[-1].startswith("deepdive: error: 5 input(s) missing")
    real = subprocess.run(
        [*DEEPDIVE, "submit", str(recipe), *relative],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
    )  # fmt: skip
    assert real.returncode == 2 and "5 inputs are missing: container.image" in real.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("cpus", [2, 0])
def test_a_conversion_jobs_srun_gets_the_cpus_its_job_asked_for(tmp_path: Path, cpus: int) -> None:
    """`deepdive convert-checkpoint`'s job, as the training job: Slurm 22.05-23.02's srun does
    not pass sbatch's --cpus-per-task to its step (docs/cluster.md, "Your site")."""
    from slurm.backends.slime.conversion import executor_parameters as conversion_parameters

    config = load_experiment(SHIPPED, [f'run.folder="{tmp_path}"', f"slurm.cpus_per_task={cpus}"])
    parameters = conversion_parameters(config)
    if cpus:
        assert parameters["cpus_per_task"] == cpus
        assert parameters["srun_args"] == [f"--cpus-per-task={cpus}"]
    else:  # left to the cluster: neither
        assert "cpus_per_task" not in parameters and "srun_args" not in parameters
