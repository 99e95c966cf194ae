"""The pieces every command table shares: a subcommand imported only when chosen, the
`--set` option, and one clear line and an exit code for each known error.

The tables themselves live with their packages (services/commands.py for `python -m services`,
slurm/cli.py for `deepdive`), so this kit names no command.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from services.base.errors import ConfigError, DeepDiveError

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

    def load(self, parser: argparse.ArgumentParser) -> None:
        module = importlib.import_module(self.module)
        getattr(module, self.options)(parser)
        parser.set_defaults(handler=getattr(module, self.handler))


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


def add_overrides_argument(parser: argparse.ArgumentParser, example: str) -> None:
    """`--set table.key=value`, repeatable: what every command that reads a TOML config takes
    (services.base.typed_config.apply_override reads each)."""
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
    ConfigError, the user's input to fix; 1: any other DeepDiveError, a runtime failure such as
    a Slurm command failing or a service that would not start; 130: interrupted)."""
    handler: Handler = args.handler
    try:
        handler(args)
    except ConfigError as error:
        print(f"{program}: error: {error.message}", file=sys.stderr)
        return 2
    except DeepDiveError as error:  # a fact of the world: a command, a process, an upstream failed
        print(f"{program}: error: {error.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
