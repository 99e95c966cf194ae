"""The `deepdive` command. Each subcommand's options and behaviour live with the package that owns
it; this module only assembles them and turns known errors into one clear line and exit code 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from deepdive import command as deepdive_command
from services.exceptions import ConfigError
from services.reward_server import command as reward_server_command
from services.tool_server import command as tool_server_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="deepdive",
        description="Train DeepDive-style web-search agents with multi-turn GRPO on Slurm.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    convert = commands.add_parser(
        "convert",
        help="convert DeepDive QA rows into slime prompt rows",
        description="Turn QA rows (question, answer, id?, aliases?) into slime's prompt format.",
    )
    deepdive_command.add_convert_arguments(convert)
    convert.set_defaults(handler=deepdive_command.run_convert)

    world = commands.add_parser(
        "world",
        help="generate the offline world: corpus, questions, demonstrations",
        description="Generate a fictional world (deterministic by seed) for runs without internet.",
    )
    deepdive_command.add_world_arguments(world)
    world.set_defaults(handler=deepdive_command.run_world)

    serve = commands.add_parser("serve", help="run one of the HTTP services")
    services = serve.add_subparsers(dest="service", required=True, metavar="SERVICE")
    tools = services.add_parser(
        "tools",
        help="the tool server (search / click / open)",
        description="Serve search, click and open over HTTP (POST /tool).",
    )
    tool_server_command.add_arguments(tools)
    tools.set_defaults(handler=tool_server_command.run)
    reward = services.add_parser(
        "reward",
        help="the reward server (strict binary reward)",
        description="Serve DeepDive's strict binary reward over HTTP (POST /evaluate).",
    )
    reward_server_command.add_arguments(reward)
    reward.set_defaults(handler=reward_server_command.run)
    engine = services.add_parser(
        "engine",
        help="the local inference engine (SGLang's /generate for a local model)",
        description="Serve a local Hugging Face causal LM with SGLang's /generate API, batched.",
    )
    deepdive_command.add_engine_arguments(engine)
    engine.set_defaults(handler=deepdive_command.run_engine)
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
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
