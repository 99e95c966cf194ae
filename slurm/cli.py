"""The `deepdive` command. Each subcommand's options and behaviour live with the package that owns
it; this module only assembles them and turns known errors into one clear line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from deepdive import command as deepdive_command
from deepdive.local import command as local_command
from deepdive.offline import command as world_command
from services.exceptions import ConfigError, ServiceError
from services.reward_server import command as reward_server_command
from services.tool_server import command as tool_server_command

Subcommand = tuple[
    str, str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], None]
]

# name, one-line help, description, options, handler
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
]
SERVICES: list[Subcommand] = [
    (
        "tools",
        "the tool server (search / click / open)",
        "Serve search, click and open over HTTP (POST /tool).",
        tool_server_command.add_arguments,
        tool_server_command.run,
    ),
    (
        "reward",
        "the reward server (strict binary reward)",
        "Serve DeepDive's strict binary reward over HTTP (POST /evaluate).",
        reward_server_command.add_arguments,
        reward_server_command.run,
    ),
    (
        "engine",
        "the local inference engine (SGLang's /generate for a local model)",
        "Serve a local Hugging Face causal LM with SGLang's /generate API, batched.",
        local_command.add_engine_arguments,
        local_command.run_engine,
    ),
]


def _add(group: Any, subcommands: list[Subcommand]) -> None:
    for name, summary, description, add_arguments, handler in subcommands:
        parser = group.add_parser(name, help=summary, description=description)
        add_arguments(parser)
        parser.set_defaults(handler=handler)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepdive",
        description="Train DeepDive-style web-search agents with multi-turn GRPO on Slurm.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add(commands, COMMANDS)
    serve = commands.add_parser("serve", help="run one of the HTTP services")
    _add(serve.add_subparsers(dest="service", required=True, metavar="SERVICE"), SERVICES)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], None] = args.handler
    try:
        handler(args)
    except ConfigError as error:
        print(f"deepdive: error: {error.message}", file=sys.stderr)
        return 2
    except ServiceError as error:  # a service that would not start, an upstream that failed
        print(f"deepdive: error: {error.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
