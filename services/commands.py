"""`python -m services SERVICE`: the services' own command table and entry point (the `deepdive`
command adds these services under `deepdive serve`), and each service's config dataclass, for
a launcher that checks a service's config (a table of its TOML file) before it starts one.

A service process is started by its own package's entry, never through the launcher above it,
so the bottom layer never names the top one.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from services.base.cli import Subcommand, add_subcommands, run_handler
from services.base.errors import ConfigError
from services.base.typed_config import from_mapping

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


# each service's config dataclass, imported when asked for: `python -m services NAME --config
# FILE` reads a TOML file of it (services.base.config_options)
CONFIGS = {
    "tools": "services.tool_server.config:ToolServerConfig",
    "reward": "services.reward_server.config:RewardServerConfig",
}


def service_defaults(name: str) -> object:
    """The config service `name` runs with when its file sets nothing."""
    _service(name)
    module, _, schema = CONFIGS[name].partition(":")
    return getattr(importlib.import_module(module), schema)()


def service_config(name: str, table: Mapping[str, Any], source: str, where: str) -> object:
    """`table` read as service `name`'s config file would be, on top of its defaults: a
    ConfigError names `source`, the key under `where` and what was expected."""
    defaults = service_defaults(name)
    return from_mapping(type(defaults), dict(table), source, where, defaults)


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
