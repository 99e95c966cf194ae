"""`python -m services SERVICE`: the services' own entry point, and the pieces every command
table shares (the `deepdive` command adds these services under `deepdive serve`).

A service process is started by its own package's entry, never through the launcher above it,
so the bottom layer never names the top one.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from services.exceptions import ConfigError, ServiceError

Handler = Callable[[argparse.Namespace], None]


@dataclass(frozen=True)
class Subcommand:
    """One command of a table. `module` is imported only when this command is chosen (its
    options are built then): `deepdive --help` or another command's help never pays for the
    servers, Ray or torch. The module has `add_arguments` and `run` functions, or the ones
    named by `options` and `handler`."""

    name: str
    summary: str  # one line, in the table's help
    description: str
    module: str
    options: str = "add_arguments"
    handler: str = "run"
    # what the handler builds from the parsed options before anything starts (its config):
    # a ConfigError for what it would refuse (`check_service_arguments`)
    checks: str = "check_arguments"

    def load(self, parser: argparse.ArgumentParser) -> None:
        module = importlib.import_module(self.module)
        getattr(module, self.options)(parser)
        parser.set_defaults(handler=getattr(module, self.handler))


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


class LazyParser(argparse.ArgumentParser):
    """A subcommand's parser whose options are built the first time it is used."""

    def __init__(self, *args: Any, subcommand: Subcommand | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._subcommand = subcommand

    def _load(self) -> None:
        if self._subcommand is not None:
            subcommand, self._subcommand = self._subcommand, None
            subcommand.load(self)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._load()
        return super().format_help()


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


def add_subcommands(
    parser: argparse.ArgumentParser, dest: str, metavar: str, subcommands: Sequence[Subcommand]
) -> Any:
    """A required choice among `subcommands`, each built only when chosen; the group."""
    group = parser.add_subparsers(
        dest=dest, required=True, metavar=metavar, parser_class=LazyParser
    )
    for subcommand in subcommands:
        group.add_parser(
            subcommand.name,
            help=subcommand.summary,
            description=subcommand.description,
            subcommand=subcommand,
        )
    return group


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
    add_subcommands(parser, "service", "SERVICE", SERVICES)
    return run_handler("services", parser.parse_args(argv))
