"""`python -m services SERVICE`: the services' own command table and entry point (the `deepdive`
command adds these services under `deepdive serve`), and the reading of a service's options
for a launcher that checks them before it starts one.

A service process is started by its own package's entry, never through the launcher above it,
so the bottom layer never names the top one.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from typing import NoReturn

from services.base.cli import Subcommand, add_subcommands, run_handler
from services.base.errors import ConfigError

SERVICES: list[Subcommand] = [
    Subcommand(
        "tools",
        "the tool server (search / click / open)",
        "Serve search, click and open over HTTP (POST /tool).",
        "services.tool_server.command",
    ),
    Subcommand(
        "reward",
        "the reward server (strict binary reward)",
        "Serve DeepDive's strict binary reward over HTTP (POST /evaluate).",
        "services.reward_server.command",
    ),
]


class _RefusingParser(argparse.ArgumentParser):
    """A parser that raises what it would print and exit with."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def service_parser(name: str) -> argparse.ArgumentParser:
    """The options of `python -m services NAME`, as the service reads them, for reading them
    elsewhere (a launcher checking a service's options before it starts one): no
    abbreviations, and an error raised (ConfigError; argparse.ArgumentError naming the option
    when one value is wrong), never an exit."""
    parser = _RefusingParser(prog=f"python -m services {name}", allow_abbrev=False)
    parser.exit_on_error = False
    _service(name).load(parser)
    return parser


def check_service_arguments(name: str, args: argparse.Namespace) -> None:
    """What the service builds from `args` before it starts (its config), built and thrown
    away: a ConfigError for what it would refuse."""
    module = importlib.import_module(_service(name).module)
    getattr(module, _service(name).checks)(args)


def _service(name: str) -> Subcommand:
    found = [subcommand for subcommand in SERVICES if subcommand.name == name]
    if not found:
        raise ConfigError(f"{name}: not a service (one of: {', '.join(s.name for s in SERVICES)})")
    return found[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services", description="Run one of the HTTP services."
    )
    add_subcommands(parser, "service", "SERVICE", SERVICES)
    return run_handler("services", parser.parse_args(argv))
