"""`deepdive smoke [EXPERIMENT]` (and `make gpu-smoke`): the GPU acceptance kit's command line.

Without an experiment the kit runs here, as one node (a GPU node you are logged in on, or an
interactive allocation); with one it is submitted as one Slurm job of the experiment's nodes,
GPUs and image (`--here` runs it here with the experiment's settings instead). Either way a
failed step makes the exit code 1, after every node's lines and the summary are printed.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from services.base.cli import add_overrides_argument
from services.base.errors import ConfigError
from slurm.config import ExperimentConfig, load_experiment
from slurm.smoke.context import here
from slurm.smoke.job import (
    SmokeFailed,
    SmokeJob,
    executor_parameters,
    smoke_folder,
    submit,
    wait_for_report,
)
from slurm.smoke.report import verdict
from slurm.smoke.runner import run_node
from slurm.smoke.steps import STEPS, Step, plan, select


def add_smoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        nargs="?",
        type=Path,
        help="an experiment file: run the kit as one Slurm job of its nodes, GPUs and image "
        "(omitted: here, as one node, with the default settings)",
    )
    steps = ", ".join(f"{step.number} {step.name}" for step in STEPS)
    parser.add_argument(
        "--only", default="", metavar="STEPS", help=f"some steps, by number or name ({steps})"
    )
    parser.add_argument(
        "--model",
        default="",
        help="a Hugging Face model folder for steps 4 and 5 (Qwen2.5-0.5B-Instruct)",
    )
    parser.add_argument("--tp", type=int, default=2, help="SGLang's tensor parallelism (step 4)")
    parser.add_argument(
        "--nodes", type=int, help="override slurm.nodes (2 for the cross-node checks)"
    )
    parser.add_argument(
        "--keep-going", action="store_true", help="run every step even after one failed"
    )
    parser.add_argument(
        "--here", action="store_true", help="with an experiment: run here, not as a job"
    )
    parser.add_argument(
        "--folder", type=Path, help="here: where the kit writes (default: a new folder in /tmp)"
    )
    parser.add_argument(
        "--wait", action="store_true", help="a job: wait for it, print its report, exit with it"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the steps (and a job's sbatch script); run nothing",
    )
    add_overrides_argument(parser, '--set slurm.partition="gpu"')


def run_smoke(args: argparse.Namespace) -> None:
    steps = select(args.only)
    if args.tp < 1:
        raise ConfigError(f"--tp: expected at least 1, got {args.tp}")
    if args.config is None:
        if args.here or args.wait or args.nodes is not None or args.overrides:
            raise ConfigError("--here, --wait, --nodes and --set need an experiment file")
        run_here(ExperimentConfig(), steps, args)
        return
    overrides = list(args.overrides)
    if args.nodes is not None:
        overrides.append(f"slurm.nodes={args.nodes}")
    config = load_experiment(args.config, overrides)
    if args.here:
        run_here(config, steps, args)
        return
    check_model(steps, args.model)
    if args.dry_run:
        from slurm.launch.submit import sbatch_script

        print("# the kit's job (submitit renders it; every node runs the steps below)")
        print(sbatch_script(config, executor_parameters(config, steps)))
        print(plan(steps))
        return
    job = SmokeJob(config, args.only, args.model, args.tp, args.keep_going)
    job_id = submit(config, job, steps)
    folder = smoke_folder(config, job_id)
    print(f"submitted job {job_id}: the GPU smoke kit on {config.slurm.nodes} node(s)")
    print(f"  report      {folder}/report.txt")
    print(f"  node logs   {config.run_folder.submitit / job_id}/")
    if args.wait:
        print(wait_for_report(config, job_id), end="")


def check_model(steps: list[Step], model: str) -> None:
    """Before a job waits in the queue: the steps that load a model have one to load."""
    needing = [f"{step.number} {step.name}" for step in steps if step.needs_model]
    if needing and not (model and (Path(model) / "config.json").is_file()):
        given = f"{model} has no config.json" if model else "none was given"
        raise ConfigError(
            f"--model: step(s) {', '.join(needing)} need a Hugging Face model folder every node "
            f"sees (bound into the image: [container] binds); {given} (or --only other steps)"
        )


def run_here(config: ExperimentConfig, steps: list[Step], args: argparse.Namespace) -> None:
    if args.dry_run:
        print(plan(steps))
        return
    folder: Path = args.folder or Path(tempfile.mkdtemp(prefix="deepdive-smoke-"))
    folder = folder.absolute()
    if folder.is_dir() and any(folder.iterdir()):
        raise ConfigError(
            f"--folder {folder} is not empty: the kit needs a fresh folder (an earlier run's "
            "notes would answer for this one)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    results = run_node(steps, here(config, folder, args.model, args.tp), args.keep_going)
    if not verdict(results):
        raise SmokeFailed(f"gpu-smoke failed; the report is {folder / 'report.txt'}")
