"""`deepdive convert-checkpoint to-megatron|to-hf CONFIG`: the slime backend's own command, the
command-line face of its conversion jobs (slurm/backends/slime/conversion.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from services.base.cli import add_overrides_argument
from services.base.errors import ConfigError
from slurm.config import load_experiment
from slurm.launch.preflight import require_inputs
from slurm.run_folder import private_folder


def add_convert_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("direction", choices=["to-megatron", "to-hf"])
    parser.add_argument("config", type=Path, help="the experiment file (backend = slime)")
    parser.add_argument(
        "--iteration", default="latest", help="to-hf: a training iteration, or latest"
    )
    add_overrides_argument(parser, '--set slime.model.hf_checkpoint="/models/Qwen3-8B"')
    parser.add_argument(
        "--dry-run", action="store_true", help="print the job and the command; submit nothing"
    )


def run_convert_checkpoint(args: argparse.Namespace) -> None:
    from slurm.backends.slime.conversion import executor_parameters, plan, submit
    from slurm.launch.submit import sbatch_script

    config = load_experiment(args.config, args.overrides)
    if config.run.backend != "slime":
        raise ConfigError(
            f"{args.config}: convert-checkpoint converts slime checkpoints (backend = slime)"
        )
    if not args.dry_run:
        require_inputs(config, ("container.", "slime.model.hf_checkpoint"))
    conversion = plan(config, args.direction, args.iteration)
    if conversion.output.exists():
        raise ConfigError(f"{conversion.output} exists already: nothing to convert")
    python = config.container.python if config.container.image else sys.executable
    command = shlex.join(conversion.command(python, conversion.output))
    if args.dry_run:
        print("# the sbatch script (one node, the training image)")
        print(sbatch_script(config, executor_parameters(config)))
        print("# the conversion it runs (into a partial folder, renamed to the output on success)")
        print(command)
        return
    run = config.run_folder
    private_folder(run.root)
    private_folder(run.submitit)
    job_id = submit(config, conversion)
    print(f"submitted job {job_id}: {args.direction}, writing {conversion.output}")
