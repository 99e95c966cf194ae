"""The `deepdive` command. Each subcommand's options and behaviour live with the package that owns
it; this module only assembles them and turns known errors into one clear line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from deepdive import command as deepdive_command
from deepdive.local import command as local_command
from deepdive.offline import command as world_command
from services.cli import SERVICES, Subcommand, add_subcommands, run_handler
from slurm import command as slurm_command
from slurm.smoke import command as smoke_command

COMMANDS: list[Subcommand] = [
    (
        "convert",
        "convert DeepDive QA rows into slime prompt rows",
        "Turn QA rows (question, answer, id?, aliases?) into slime's prompt format.",
        deepdive_command.add_convert_arguments,
        deepdive_command.run_convert,
    ),
    (
        "world",
        "generate the offline world: corpus, questions, demonstrations",
        "Generate a fictional world (deterministic by seed) for runs without internet.",
        world_command.add_world_arguments,
        world_command.run_world,
    ),
    (
        "run",
        "train on this machine: world, services, warm start, GRPO, evaluation",
        "Run the whole pipeline locally (no GPU, keys or cluster); resumes from its checkpoints.",
        local_command.add_run_arguments,
        local_command.run_local,
    ),
    (
        "submit",
        "submit a training job to Slurm (submitit): Ray and services on every node",
        "Validate the experiment, create its run folder and submit it; --dry-run prints the "
        "sbatch script and the training command instead.",
        slurm_command.add_submit_arguments,
        slurm_command.run_submit,
    ),
    (
        "status",
        "a submitted run's state, attempt, phase, step and reward",
        "Where a submitted run stands: Slurm's state, the attempt, each node's phase, the "
        "last step and its reward, failures.",
        slurm_command.add_status_arguments,
        slurm_command.run_status,
    ),
    (
        "logs",
        "a node's log of a submitted run",
        "Print (or follow) one node's log of the newest attempt of a run.",
        slurm_command.add_logs_arguments,
        slurm_command.run_logs,
    ),
    (
        "cancel",
        "cancel a submitted run's job (its checkpoints stay)",
        "Cancel the newest job of a run; submitting the run again resumes it.",
        slurm_command.add_cancel_arguments,
        slurm_command.run_cancel,
    ),
    (
        "convert-checkpoint",
        "convert a model to Megatron's format, or a checkpoint back to Hugging Face (a job)",
        "Run slime's conversion tools as a one-node Slurm job in the training image: "
        "to-megatron makes the torch_dist reference from slime.model.hf_checkpoint, to-hf "
        "turns a training checkpoint into a Hugging Face folder.",
        slurm_command.add_convert_checkpoint_arguments,
        slurm_command.run_convert_checkpoint,
    ),
    (
        "smoke",
        "the GPU acceptance kit: image, NCCL, Ray, SGLang, slime, each step checked",
        "Check a cluster's GPU nodes in the training image, step by step (docs/gpu-smoke.md): "
        "here, or as one Slurm job of an experiment's nodes and image.",
        smoke_command.add_smoke_arguments,
        smoke_command.run_smoke,
    ),
    (
        "eval",
        "evaluate checkpoints on an eval set with the rollout and the services of training",
        "Serve each checkpoint (the local engine on CPU, SGLang on a GPU), play the eval set "
        "through the same rollout and reward, and write per-question results, a summary and "
        "a comparison table.",
        slurm_command.add_eval_arguments,
        slurm_command.run_eval,
    ),
]
ENGINE: Subcommand = (
    "engine",
    "the local inference engine (SGLang's /generate for a local model)",
    "Serve a local Hugging Face causal LM with SGLang's /generate API, batched.",
    local_command.add_engine_arguments,
    local_command.run_engine,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepdive",
        description="Train DeepDive-style web-search agents with multi-turn GRPO on Slurm.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_subcommands(commands, COMMANDS)
    serve = commands.add_parser("serve", help="run one of the HTTP services")
    services = serve.add_subparsers(dest="service", required=True, metavar="SERVICE")
    add_subcommands(services, [*SERVICES, ENGINE])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_handler("deepdive", build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
