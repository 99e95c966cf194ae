"""TOML files read into typed, frozen dataclasses, with errors that name the file, the key,
what was expected and what was found; shared by every command that takes a config file.

A dataclass field whose type is another dataclass is a TOML table. Unknown keys are errors
(a typo must not silently fall back to a default; the closest field names are suggested), as
are wrong types; an int is accepted where a float is expected, a bool never counts as a number;
a string is a `Path` where the field is one, a list a tuple where the field is one.

`base`: the values a table is read on top of (a service's defaults, whose nested tables have
required fields of their own), instead of the dataclass's class defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import tomllib
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

from services.base.errors import ConfigError

__all__ = [
    "describe",
    "from_mapping",
    "load_toml",
    "positive",
    "require",
]

T = TypeVar("T")


def require(condition: bool, key: str, expected: str, value: object) -> None:
    """One rule of a config value: a ConfigError naming the key, what it expects and what it got."""
    if not condition:
        raise ConfigError(f"{key}: expected {expected}, got {value!r}")


def positive(key: str, value: object) -> None:
    """A positive, finite number (a bool is not a number; NaN and infinity are refused)."""
    ok = (
        not isinstance(value, bool)
        and isinstance(value, int | float)
        and math.isfinite(value)
        and value > 0
    )
    require(ok, key, "a positive number", value)


def load_toml(path: Path | None, schema: type[T], overrides: Sequence[str] = ()) -> T:
    """`path` (None: defaults only), then each "table.key=value" override on top of it."""
    data: dict[str, Any] = {}
    source = str(path) if path is not None else "defaults"
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{path}: not valid TOML ({error})") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not UTF-8 text") from None
    for override in overrides:
        apply_override(data, override)
    if overrides:
        source += " with --set " + " ".join(overrides)
    return from_mapping(schema, data, source, "")


def apply_override(data: dict[str, Any], override: str) -> None:
    """ "grpo.steps=5" or 'run.out="runs/a"' (a value that is not TOML is taken as a string)."""
    key, separator, text = override.partition("=")
    if not separator or not key.strip():
        raise ConfigError(f"--set {override}: expected table.key=value")
    try:
        value = tomllib.loads(f"value = {text.strip()}")["value"]
    except tomllib.TOMLDecodeError:
        value = text.strip()
    *tables, name = [part.strip() for part in key.split(".")]
    target = data
    for table in tables:
        target = target.setdefault(table, {})
        if not isinstance(target, dict):
            raise ConfigError(f"--set {override}: {table} is not a table")
    target[name] = value


def from_mapping(schema: type[T], data: Any, source: str, table: str, base: T | None = None) -> T:
    """`data` (a TOML table) as `schema`: on top of `base` where given, else of the class
    defaults; a ConfigError names `source`, the key and what was expected."""
    where = f"[{table}]" if table else "the top level"
    if not isinstance(data, dict):
        raise ConfigError(_at(source, f"{where}: expected a table, got {_kind(data)}"))
    fields = {field.name: field for field in dataclasses.fields(schema)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=3)
        hint = f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
        raise ConfigError(
            _at(
                source,
                f"{where}: unknown key {unknown[0]!r} (expected one of: {', '.join(fields)}){hint}",
            )
        )
    hints = get_type_hints(schema)
    values: dict[str, Any] = {}
    for name, value in data.items():
        key = f"{table}.{name}" if table else name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            inner = getattr(base, name) if base is not None else None
            values[name] = from_mapping(typing.cast(type, hint), value, source, key, inner)
        else:
            values[name] = _check(hint, value, source, key)
    try:
        if base is not None:
            return dataclasses.replace(base, **values)  # type: ignore[type-var]
        return schema(**values)
    except ConfigError as error:  # a dataclass's own cross-field checks
        message = error.message
        if base is not None and table:  # a service's dataclass names its own fields only
            message = f"{table}.{message}"
        raise ConfigError(_at(source, message)) from None


def _check(hint: Any, value: Any, source: str, key: str) -> Any:
    expected = describe(hint)
    if _matches(hint, value):
        return _converted(hint, value)
    raise ConfigError(_at(source, f"{key}: expected {expected}, got {_kind(value)} {value!r}"))


def _at(source: str, message: str) -> str:
    """`message` prefixed with where it comes from ("": a table inside a file read already)."""
    return f"{source}: {message}" if source else message


def _converted(hint: Any, value: Any) -> Any:
    """A matching TOML value as the field holds it: a float, a Path, a tuple."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):  # a number stays as written, as it always has
        chosen = next(arg for arg in get_args(hint) if _matches(arg, value))
        return value if chosen is float else _converted(chosen, value)
    if hint is float:
        return float(value)
    if hint is Path:
        return Path(value)
    if origin is tuple:
        return tuple(_converted(get_args(hint)[0], item) for item in value)
    if origin is list:
        return [_converted(get_args(hint)[0], item) for item in value]
    return value


def _matches(hint: Any, value: Any) -> bool:
    origin = get_origin(hint)
    if hint is Any:
        return True
    if hint is Path:
        return isinstance(value, str)
    if origin is Literal:
        return value in get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(arg, value) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (list, tuple):
        (item,) = get_args(hint)[:1]
        return isinstance(value, list) and all(_matches(item, v) for v in value)
    if origin is dict:
        key_type, value_type = get_args(hint)
        return isinstance(value, dict) and all(
            _matches(key_type, k) and _matches(value_type, v) for k, v in value.items()
        )
    return isinstance(value, hint)


def describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in get_args(hint) if a is not type(None))
    if origin in (list, tuple):
        return f"a list of {describe(get_args(hint)[0])}"
    if origin is dict:
        return f"a table of key = value ({describe(get_args(hint)[1])} each)"
    names = {
        Any: "any value",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a string",
        Path: "a path (a string)",
    }
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _kind(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)
