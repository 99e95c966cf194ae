"""`python -m services SERVICE`: the services' own entry point, and the pieces every command
table shares (the `deepdive` command adds these services under `deepdive serve`).

A service process is started by its own package's entry, never through the launcher above it,
so the bottom layer never names the top one.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from services.exceptions import ConfigError, ServiceError
from services.reward_server import command as reward_server_command
from services.tool_server import command as tool_server_command

Handler = Callable[[argparse.Namespace], None]
# name, one-line help, description, options, handler
Subcommand = tuple[str, str, str, Callable[[argparse.ArgumentParser], None], Handler]

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
]


def add_overrides_argument(parser: argparse.ArgumentParser, example: str) -> None:
    """`--set table.key=value`, repeatable: what every command that reads a TOML config takes
    (services.typed_config.apply_override reads each)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="TABLE.KEY=VALUE",
        help=f"override one value, e.g. {example} (repeatable)",
    )


def add_subcommands(group: Any, subcommands: Sequence[Subcommand]) -> None:
    for name, summary, description, add_arguments, handler in subcommands:
        parser = group.add_parser(name, help=summary, description=description)
        add_arguments(parser)
        parser.set_defaults(handler=handler)


def run_handler(program: str, args: argparse.Namespace) -> int:
    """Run the parsed command; known errors become one clear line and an exit code (2: a
    configuration error, 1: a service or upstream failure, 130: interrupted)."""
    handler: Handler = args.handler
    try:
        handler(args)
    except ConfigError as error:
        print(f"{program}: error: {error.message}", file=sys.stderr)
        return 2
    except ServiceError as error:  # a service that would not start, an upstream that failed
        print(f"{program}: error: {error.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services", description="Run one of the HTTP services."
    )
    add_subcommands(
        parser.add_subparsers(dest="service", required=True, metavar="SERVICE"), SERVICES
    )
    return run_handler("services", parser.parse_args(argv))
