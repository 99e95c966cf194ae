"""The `deepdive` command. Each subcommand's options and behaviour live with the package that owns
it; this module only names them (each module is imported only when its command is chosen: the
help of one command loads none of the others) and turns known errors into one clear line and an
exit code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.base.cli import Subcommand, add_subcommands, run_handler
from services.commands import SERVICES

COMMANDS: list[Subcommand] = [
    Subcommand(
        "convert",
        "convert DeepDive QA rows into slime prompt rows",
        "Turn QA rows (question, answer, id?, aliases?) into slime's prompt format.",
        "deepdive.convert.command",
        "add_convert_arguments",
        "run_convert",
    ),
    Subcommand(
        "world",
        "generate the offline world: corpus, questions, demonstrations",
        "Generate a fictional world (deterministic by seed) for runs without internet.",
        "deepdive.offline.command",
        "add_world_arguments",
        "run_world",
    ),
    Subcommand(
        "run",
        "train on this machine: world, services, warm start, GRPO, evaluation",
        "Run the whole pipeline locally (no GPU, keys or cluster); resumes from its checkpoints.",
        "deepdive.local.command",
        "add_run_arguments",
        "run_local",
    ),
    Subcommand(
        "submit",
        "submit a training job to Slurm (submitit): Ray and services on every node",
        "Validate the experiment, create its run folder and submit it; --dry-run prints the "
        "sbatch script and the training command instead.",
        "slurm.launch.command",
        "add_submit_arguments",
        "run_submit",
    ),
    Subcommand(
        "status",
        "a submitted run's state, attempt, phase, step and reward",
        "Where a submitted run stands: Slurm's state, the attempt, each node's phase, the "
        "last step and its reward, failures.",
        "slurm.launch.command",
        "add_status_arguments",
        "run_status",
    ),
    Subcommand(
        "logs",
        "a node's log of a submitted run",
        "Print (or follow) one node's log of the newest attempt of a run.",
        "slurm.launch.command",
        "add_logs_arguments",
        "run_logs",
    ),
    Subcommand(
        "cancel",
        "cancel a submitted run's job (its checkpoints stay)",
        "Cancel the newest job of a run; submitting the run again resumes it.",
        "slurm.launch.command",
        "add_cancel_arguments",
        "run_cancel",
    ),
    Subcommand(
        "convert-checkpoint",
        "convert a model to Megatron's format, or a checkpoint back to Hugging Face (a job)",
        "Run slime's conversion tools as a one-node Slurm job in the training image: "
        "to-megatron makes the torch_dist reference from slime.model.hf_checkpoint, to-hf "
        "turns a training checkpoint into a Hugging Face folder.",
        "slurm.backends.slime.command",
        "add_convert_checkpoint_arguments",
        "run_convert_checkpoint",
    ),
    Subcommand(
        "smoke",
        "the GPU acceptance kit: image, NCCL, Ray, SGLang, slime, each step checked",
        "Check a cluster's GPU nodes in the training image, step by step (docs/gpu-smoke.md): "
        "here, or as one Slurm job of an experiment's nodes and image.",
        "slurm.smoke.command",
        "add_smoke_arguments",
        "run_smoke",
    ),
    Subcommand(
        "eval",
        "evaluate checkpoints on an eval set with the rollout and the services of training",
        "Serve each checkpoint (the local engine on CPU, SGLang on a GPU), play the eval set "
        "through the same rollout and reward, and write per-question results, a summary and "
        "a comparison table.",
        "slurm.launch.command",
        "add_eval_arguments",
        "run_eval",
    ),
    Subcommand(
        "trajectories",
        "the episodes of a run or an eval: on the terminal, or one HTML page",
        "Print a run's (or a `deepdive eval` folder's) episodes turn by turn, filtered with "
        "--where; --html FILE writes a self-contained page with the per-step statistics as "
        "plots and a filterable list of episodes.",
        "slurm.launch.command",
        "add_trajectories_arguments",
        "run_trajectories",
    ),
]
ENGINE = Subcommand(
    "engine",
    "the local inference engine (SGLang's /generate for a local model)",
    "Serve a local Hugging Face causal LM with SGLang's /generate API, batched.",
    "deepdive.local.command",
    "add_engine_arguments",
    "run_engine",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepdive",
        description="Train DeepDive-style web-search agents with multi-turn GRPO on Slurm.",
    )
    commands = add_subcommands(parser, "command", "COMMAND", COMMANDS)
    serve = commands.add_parser("serve", help="run one of the HTTP services")
    add_subcommands(serve, "service", "SERVICE", [*SERVICES, ENGINE])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run_handler("deepdive", build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
