"""`[services.tools]` and `[services.reward]`: a service's options as a TOML table, one key per
option of `python -m services tools|reward` (`--judge-model` is `judge_model`; `true` passes a
switch, a list repeats an option that takes several), so

    [services.tools]
    search = "serper"
    reader = "jina"
    block_domain = ["example.com"]

runs `python -m services tools --search serper --reader jina --block-domain example.com`.

The table is read by the service's own parser and turned into the service's own config
(services.commands.check_service_arguments: ToolServerConfig, RewardServerConfig and their checks)
when the experiment loads, so a typo or a bad value fails at submission, naming the key, not on
the node after the allocation; nothing of the options is declared a second time here. What the
launcher sets itself (the address, the port, the workers, the log level, the env file) is
refused in the table, and a file the job reads (`corpus`) is checked by slurm.preflight, so
a dry run prints what would run before it exists.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Mapping

from services.base.errors import ConfigError

OptionValue = str | int | float | bool | list[str]
# options the launcher gives every service itself, and where they come from
SET_BY_THE_LAUNCHER = {
    "host": "services.host",
    "port": "the node's port plan",
    "workers": "services.tool_workers",
    "log_level": "services.log_level",
    "env_file": "services.env_file",
    "allow_unauthenticated": "services.host with DEEPDIVE_SERVICE_TOKEN",
}
# options that name a file the job reads: slurm.preflight lists it when it is missing
INPUT_FILES = ("corpus",)
# options that are paths: taken from where you submit, as the experiment's other paths
PATHS = ("corpus", "index_cache")


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _text(value: object) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def option_arguments(key: str, value: OptionValue) -> list[str]:
    """One key's command-line arguments: `--key value`; true `--key`, false nothing; a list
    `--key item` for each item."""
    if isinstance(value, bool):
        return [_flag(key)] if value else []
    if isinstance(value, list):
        return [item for element in value for item in (_flag(key), _text(element))]
    return [_flag(key), _text(value)]


def service_arguments(options: Mapping[str, OptionValue]) -> list[str]:
    """The service's command-line arguments for its table, in the table's order."""
    return [item for key, value in options.items() for item in option_arguments(key, value)]


def check_service_options(service: str, options: Mapping[str, OptionValue]) -> None:
    """Parse `[services.SERVICE]` as the service parses its command line and build the config
    it would build: a ConfigError naming `services.SERVICE.KEY` (or the table, for a rule
    between keys) and what is wrong."""
    from services.commands import check_service_arguments, service_parser

    table = f"services.{service}"
    parser = service_parser(service)

    def check(arguments: argparse.Namespace, where: str) -> None:
        for key in INPUT_FILES:  # whether it exists is slurm.preflight's
            if getattr(arguments, key, None) is not None:
                setattr(arguments, key, None)
        try:
            check_service_arguments(service, arguments)
        except ConfigError as error:
            raise ConfigError(f"{where}: {error.message}") from None

    for key, value in options.items():  # each key alone first: its error names it
        where = f"{table}.{key}"
        if key in SET_BY_THE_LAUNCHER:
            raise ConfigError(f"{where}: set by the launcher ({SET_BY_THE_LAUNCHER[key]})")
        found = _parse(parser, option_arguments(key, value), where, service)
        if isinstance(value, list) and getattr(found, key, None) != [_text(item) for item in value]:
            raise ConfigError(f"{where}: takes one value, not a list")
        check(found, where)
    check(_parse(parser, service_arguments(options), table, service), table)  # the keys together


def _parse(
    parser: argparse.ArgumentParser, arguments: list[str], where: str, service: str
) -> argparse.Namespace:
    try:
        found, extra = parser.parse_known_args(arguments)
    except argparse.ArgumentError as error:
        raise ConfigError(f"{where}: {error.message}") from None
    except ConfigError as error:  # argparse's own words
        raise ConfigError(f"{where}: {error.message}") from None
    if extra and extra[0] == arguments[0]:
        known = sorted(set(re.findall(r"--([a-z][a-z0-9-]*)", parser.format_help())))
        keys = [option.replace("-", "_") for option in known]
        close = difflib.get_close_matches(where.rsplit(".", 1)[-1], keys, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(
            f"{where}: not an option of `python -m services {service}`{hint}; its options: "
            f"python -m services {service} --help"
        )
    if extra:  # a value after a switch
        raise ConfigError(f"{where}: a switch: true or false, got {extra[0]!r}")
    return found
