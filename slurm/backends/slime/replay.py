"""slime's parse of train.py's argv, replayed where slime cannot be installed (CI, a login node):
the four parsers slime's `parse_args` runs (slime/utils/arguments.py, lines 1600-1643 at
624b824), rebuilt from the record scripts/slime_flags.py took of them at the pinned commits
("parsers" in slurm/backends/slime/flags.json), run over the argv as slime runs them:

1. `_pre_parse_mode`'s parser (--train-backend, --debug-*), parse_known_args;
2. `sglang_parse_args`: a small parser reads --rollout-num-gpus-per-engine and the SGLang
   pipeline size, whose quotient becomes --sglang-tensor-parallel-size's default; then SGLang's
   and the router's flags (allow_abbrev on: a flag that is a prefix of exactly one of its
   options is taken as that option), parse_known_args;
3. Megatron-LM's parser with slime's flags, parse_known_args (ignore_unknown_args=True);
4. the namespaces merged: Megatron's, then the pre-parsed, then SGLang's on top.

What the replay gives is the namespace before slime validates it (`slime_validate_args`), the
tokens no parser took (slime drops them without a word), and the dests whose recorded type or
action it cannot run (an "opaque" type keeps its string). A value slime's parsers would refuse
(a type, a choice, a missing value) raises a ConfigError naming the flag: train.py would exit
at start, after the job got its GPUs. tests/slurm/test_slime_parse.py holds the replay to the
namespace slime's own parse_args produced for the recipe (scripts/slime_parse.py).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, NoReturn

from services.base.errors import ConfigError
from slurm.backends.slime import DATA_PACKAGE
from slurm.package_data import read_json

KEYWORD_ACTIONS = {
    "store",
    "store_true",
    "store_false",
    "store_const",
    "append",
    "append_const",
    "count",
}
BASIC_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,  # Megatron's type=bool: bool("False") is True, as in slime
    "json": json.loads,
}


@dataclass(frozen=True)
class Replayed:
    namespace: dict[str, Any]  # dest -> value, as slime has it before validation
    ignored: list[str]  # argv tokens none of slime's parsers took
    approximate: list[str]  # dests the argv set through a type or action not replayed exactly


class _Parser(argparse.ArgumentParser):
    """Raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"slime: its parsers refuse the command line: {message}")


@cache
def parser_record() -> dict[str, Any]:
    return dict(read_json(DATA_PACKAGE, "flags.json")["parsers"])


def _enum_type(name: str, members: list[str]) -> Callable[[str], str]:
    recorded = {f"{name}.{member}" for member in members}  # a default, already converted

    def convert(text: str) -> str:
        if text in recorded:
            return text
        if text not in members:  # Megatron's handler raises KeyError: train.py crashes
            raise ValueError(text)
        return f"{name}.{text}"

    convert.__name__ = name
    return convert


def _add(parser: argparse.ArgumentParser, action: dict[str, Any], opaque: set[str]) -> None:
    options: list[str] = action["options"]
    kind: str = action["action"]
    keywords: dict[str, Any] = {"dest": action["dest"], "default": action["default"]}
    type_name = action["type"]
    choices = action["choices"]
    if type_name:
        if type_name in BASIC_TYPES:
            keywords["type"] = BASIC_TYPES[type_name]
        elif type_name.startswith("enum:"):
            name = type_name.removeprefix("enum:")
            keywords["type"] = _enum_type(name, list(choices or []))
            choices = [f"{name}.{member}" for member in choices or []]
        else:  # opaque: the string as given
            opaque.add(action["dest"])
    if choices is not None:
        keywords["choices"] = choices
    if kind == "boolean_optional":
        base = [option for option in options if f"--no-{option[2:]}" in options]
        options = base or options
        keywords["action"] = argparse.BooleanOptionalAction
    elif kind in KEYWORD_ACTIONS:
        keywords["action"] = kind
        if kind in ("store_const", "append_const"):
            keywords["const"] = action["const"]
        if kind in ("store", "append") and action["nargs"] is not None:
            keywords["nargs"] = action["nargs"]
    else:  # custom:NAME (SGLang's deprecation aliases, LoRA paths): its shape only
        opaque.add(action["dest"])
        if action["nargs"] == 0:
            keywords["action"] = "store_const"
            keywords["const"] = True if action["const"] is None else action["const"]
            keywords.pop("type", None)
            keywords.pop("choices", None)
        elif action["nargs"] is not None:
            keywords["nargs"] = action["nargs"]
    if kind in ("store_true", "store_false", "count", "boolean_optional"):
        keywords.pop("type", None)
    parser.add_argument(*options, **keywords)


def _build(record: dict[str, Any]) -> tuple[argparse.ArgumentParser, set[str]]:
    parser = _Parser(add_help=False, allow_abbrev=record["allow_abbrev"], exit_on_error=False)
    opaque: set[str] = set()
    for action in record["actions"]:
        _add(parser, action, opaque)
    parser.set_defaults(**record["defaults"])
    return parser, opaque


def _parse(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, list[str]]:
    try:
        return parser.parse_known_args(list(argv))
    except argparse.ArgumentError as error:
        raise ConfigError(f"slime: its parsers refuse the command line: {error}") from None


def _claim(parser: argparse.ArgumentParser, token: str) -> argparse.Action | None:
    """The action `parser` takes `token` (a --flag, maybe --flag=value) as, if any."""
    flag = token.split("=", 1)[0]
    if flag in parser._option_string_actions:
        return parser._option_string_actions[flag]
    if parser.allow_abbrev:
        matches = {
            action
            for option, action in parser._option_string_actions.items()
            if option.startswith(flag)
        }
        if len(matches) == 1:
            return matches.pop()
    return None


def _unclaimed(argv: Sequence[str], parsers: Sequence[argparse.ArgumentParser]) -> list[str]:
    """The tokens no parser takes: flags none knows and values no flag consumes."""
    ignored = []
    index = 0
    while index < len(argv):
        item = argv[index]
        index += 1
        if not item.startswith("-") or item == "-":
            ignored.append(item)
            continue
        claims = [action for parser in parsers if (action := _claim(parser, item))]
        if not claims:
            ignored.append(item)
            continue
        if "=" in item:
            continue
        wanted = max((_arity(action) for action in claims), default=0)
        while wanted and index < len(argv) and not argv[index].startswith("--"):
            index += 1
            wanted -= 1
    return ignored


def _arity(action: argparse.Action) -> int:
    """How many following tokens an action consumes at most."""
    if action.nargs is None:
        return 1
    if isinstance(action.nargs, int):
        return action.nargs
    return 1 if action.nargs == "?" else 1_000_000  # "+", "*": every value up to a flag


def replay(argv: Sequence[str]) -> Replayed:
    """The namespace slime's parse_args builds from `argv` before validating it."""
    record = parser_record()
    pre_parser, _ = _build(record["pre"])
    pre, _ = _parse(pre_parser, argv)
    tp_parser, _ = _build(record["sglang_tp"])
    tp, _ = _parse(tp_parser, argv)
    pipeline = tp.sglang_pp_size if tp.sglang_pp_size != 1 else tp.sglang_pipeline_parallel_size
    sglang_parser, sglang_opaque = _build(record["sglang"])
    sglang_parser.set_defaults(
        sglang_tensor_parallel_size=tp.rollout_num_gpus_per_engine // pipeline
    )
    sglang, _ = _parse(sglang_parser, argv)
    megatron_parser, megatron_opaque = _build(record["megatron"])
    megatron, _ = _parse(megatron_parser, argv)
    namespace = {**vars(megatron), **vars(pre), **vars(sglang)}
    parsers = (pre_parser, tp_parser, sglang_parser, megatron_parser)
    ignored = _unclaimed(argv, parsers)
    given = {token.split("=", 1)[0] for token in argv if token.startswith("--")}
    approximate = sorted(
        action["dest"]
        for name in ("sglang", "megatron")
        for action in record[name]["actions"]
        if action["dest"] in (sglang_opaque | megatron_opaque)
        and any(option in given for option in action["options"])
    )
    return Replayed(namespace, ignored, approximate)
