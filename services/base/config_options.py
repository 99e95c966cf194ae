"""A service's config as a TOML file of its own dataclass (`--config FILE`), and a command-line
option for every field of it, generated from the dataclass, for hand use: `--page-chars 4000`,
`--serper.base-url URL`, `--connections.max-connections 8000` (a nested table's fields after a
dot; dashes for underscores). An option overrides the file's key; both are read by
services.base.typed_config, so a key, an option and a default are declared once, in the
dataclass. A field that is a list takes its option once per item.

`config_table` writes the other way: a config as the table of what differs from the defaults,
what a launcher writes into the file it hands the service.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import tomli_w

from services.base.errors import ConfigError
from services.base.logs import redact
from services.base.typed_config import describe, from_mapping

T = TypeVar("T")

_DEST = "config_option:"  # the namespace attributes the generated options write


def fields_of(schema: type) -> Iterator[tuple[str, Any]]:
    """Every leaf field of `schema` as its dotted key (`serper.retry.max_attempts`) and type."""
    hints = get_type_hints(schema)
    for field in dataclasses.fields(schema):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            for key, inner in fields_of(typing.cast(type, hint)):
                yield f"{field.name}.{key}", inner
        else:
            yield field.name, hint


def option_name(key: str) -> str:
    """`search_cache.ttl_s` as an option: `--search-cache.ttl-s`."""
    return "--" + key.replace("_", "-")


def _value_at(config: object, key: str) -> object:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def _is_list(hint: Any) -> bool:
    return get_origin(hint) in (list, tuple)


def _is_text(hint: Any) -> bool:
    if get_origin(hint) in (typing.Union, types.UnionType):
        return any(_is_text(arg) for arg in get_args(hint))
    return hint in (str, Path)


def add_config_options(parser: argparse.ArgumentParser, defaults: object) -> None:
    """`--config FILE` and an option for each field of `defaults`' dataclass."""
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the service's config, a TOML file of the keys below (the options override it)",
    )
    add_field_options(parser, defaults, "each a key of --config's file (a dot: a key of a table)")


def add_field_options(
    parser: argparse.ArgumentParser, defaults: object, description: str | None = None
) -> None:
    """An option for each field of `defaults`' dataclass (its value the default the help shows)."""
    group = parser.add_argument_group("config", description)
    for key, hint in fields_of(type(defaults)):
        default = _value_at(defaults, key)
        shown = list(default) if isinstance(default, tuple) else default
        group.add_argument(
            option_name(key),
            dest=_DEST + key,
            default=argparse.SUPPRESS,
            action="append" if _is_list(hint) else "store",
            metavar="VALUE",
            help=f"{describe(hint)}{' (repeatable)' if _is_list(hint) else ''}; "
            f"default: {shown!r}".replace("%", "%%"),
        )


def config_from_options(args: argparse.Namespace, defaults: T) -> T:
    """The config `--config`'s file and the generated options give, on top of `defaults`: a
    ConfigError names the file or the option, the key and what was expected."""
    data: dict[str, Any] = {}
    source = "the command line"
    path: Path | None = getattr(args, "config", None)
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"--config {path}: no such file") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{path}: not valid TOML ({error})") from None
    hints = dict(fields_of(type(defaults)))
    given = [(name[len(_DEST) :], value) for name, value in vars(args).items()]
    options = [(key, value) for key, value in given if key in hints]
    for key, text in options:
        hint = hints[key]
        *tables, name = key.split(".")
        target = data
        for table in tables:
            target = target.setdefault(table, {})
        if _is_list(hint):
            target[name] = [_option_value(get_args(hint)[0], item) for item in text]
        else:
            target[name] = _option_value(hint, text)
    if options:
        source += " with " + " ".join(option_name(key) for key, _ in options)
    return from_mapping(type(defaults), data, source, "", defaults)


def _option_value(hint: Any, text: str) -> Any:
    """An option's text as TOML would give it: as it is for a string or a path, else read as
    a TOML value (`true`, `8`, `2.5`), else the text."""
    if _is_text(hint):
        return text
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def config_table(config: object, defaults: object) -> dict[str, Any]:
    """`config` as a TOML table: only what differs from `defaults` (the same dataclass), nested
    dataclasses as tables, paths as strings, tuples as lists."""
    table: dict[str, Any] = {}
    for field in dataclasses.fields(typing.cast(Any, config)):
        value, default = getattr(config, field.name), getattr(defaults, field.name)
        if value == default:
            continue
        if dataclasses.is_dataclass(value):
            table[field.name] = config_table(value, default)
        elif value is None:
            raise ConfigError(f"{field.name}: None has no TOML form (leave the key out)")
        else:
            table[field.name] = _toml_value(value)
    return table


def _toml_value(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | list):
        return [_toml_value(item) for item in value]
    return value


def config_text(table: dict[str, Any]) -> str:
    """A service's config file: the table as TOML. A secret registered for redaction
    (services.base.secrets reads every key so) is refused: keys live in the environment only."""
    text = tomli_w.dumps(table)
    if redact(text) != text:
        raise ConfigError("a service's config holds a secret: keys come from the environment only")
    return text
