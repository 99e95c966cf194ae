"""Write the list of every flag slime's train.py accepts at the pinned commits (slurm/backends/slime/flags.json).

slime silently ignores a flag it does not know (a misspelled or removed one is never
reported), so the launcher checks every flag it emits, and every `extra_args` flag, against
this list before anything is submitted. slime parses with two parsers
(slime/utils/arguments.py, `parse_args`): SGLang's, built by slime's wrapper
(`add_sglang_arguments`: ServerArgs under --sglang-*, the router's --router-*, slime's own
--sglang-router-*), and Megatron-LM's with slime's flags added
(`megatron.training.arguments.add_megatron_arguments`, then `get_slime_extra_args_provider`),
plus four flags it pre-parses (`_pre_parse_mode`). This script builds those parsers as slime
does and lists their option strings, so it runs where slime, Megatron-LM and SGLang import:

- in the training image: `python scripts/slime_flags.py --slime-commit … > slurm/backends/slime/flags.json`
- on a CPU machine: slime and Megatron-LM checkouts at their commits (with slime's
  docker/patch/latest/megatron.patch applied, as slime's image does) and sglang and
  sglang-router installed without their CUDA dependencies on PYTHONPATH, and `--stub
  torchvision` (SGLang imports it at start; it adds no flag). That is how the committed list
  was made; see its "sources".

The output names, for each flag, the parser that defines it (slime, megatron, sglang, router)
and whether it takes a value ("value") or none ("switch"). Under "parsers" it records the
four parsers slime's `parse_args` runs over train.py's argv, as slime builds them, each action
with what argparse needs to parse it again (option strings, dest, action, nargs, type, choices,
default, const): slurm/backends/slime/replay.py rebuilds them from this record, so the checks and CI
parse the launcher's argv as slime would, where slime cannot be installed:

- "pre": `_pre_parse_mode`'s parser (slime/utils/arguments.py), read from its source;
- "sglang_tp": the parser `sglang_parse_args` reads --rollout-num-gpus-per-engine with, to
  default --sglang-tensor-parallel-size (slime/backends/sglang_utils/arguments.py), ditto;
- "sglang": `sglang_parse_args`'s parser: `add_sglang_arguments` on ArgumentParser(add_help=False);
- "megatron": Megatron-LM's `parse_args` parser (ArgumentParser(allow_abbrev=False)) with
  slime's arguments added (`get_slime_extra_args_provider`).

A type is recorded by name: int, float, str, bool, json (json.loads), enum:NAME (an Enum by
member name; choices are the members' names), or opaque:MODULE.NAME (a function the replay
cannot run: it keeps the string). An action class of argparse is recorded by its keyword
(store, store_true, ...); any other by custom:NAME.
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib.abc
import importlib.machinery
import inspect
import json
import math
import sys
from typing import Any
from unittest import mock

SWITCH_ACTIONS = (
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
    argparse._CountAction,
    argparse.BooleanOptionalAction,
)


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Modules that only need to import (no flag comes from them) where they cannot be installed."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = mock.MagicMock(name=spec.name)
        module.__path__, module.__spec__, module.__version__ = [], spec, "0.0.0"
        return module

    def exec_module(self, module: Any) -> None:
        return None


def _kind(action: argparse.Action) -> str:
    return "switch" if isinstance(action, SWITCH_ACTIONS) or action.nargs == 0 else "value"


def _options(parser: argparse.ArgumentParser) -> dict[str, str]:
    return {
        flag: _kind(action)
        for flag, action in parser._option_string_actions.items()
        if flag.startswith("--") and flag != "--help"
    }


def _pre_parsed_flags() -> dict[str, str]:
    """The flags slime's `_pre_parse_mode` reads before its parsers are built (literal calls)."""
    from slime.utils import arguments

    tree = ast.parse(inspect.getsource(arguments._pre_parse_mode))
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
            switch = any(
                k.arg == "action" and getattr(k.value, "value", "") == "store_true"
                for k in node.keywords
            )
            found.update({flag: "switch" if switch else "value" for flag in flags})
    return found


ARGPARSE_ACTIONS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._CountAction: "count",
    argparse.BooleanOptionalAction: "boolean_optional",
}


def _json_value(value: Any) -> Any:
    """A value as JSON holds it; anything else as {"repr": ...} (never replayed, only shown)."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"repr": repr(value)}
    if isinstance(value, list | tuple):
        return [_json_value(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _json_value(item) for key, item in value.items()}
    return {"repr": repr(value)}


def _type_name(action: argparse.Action) -> str | None:
    kind = action.type
    if kind is None:
        return None
    if kind in (int, float, str, bool):
        return kind.__name__
    if kind is json.loads:
        return "json"
    choices = list(action.choices) if action.choices is not None else []
    if choices and all(isinstance(choice, enum.Enum) for choice in choices):
        return f"enum:{type(choices[0]).__name__}"
    return f"opaque:{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', repr(kind))}"


def _action_record(action: argparse.Action) -> dict[str, Any]:
    choices = None
    if action.choices is not None:
        choices = [
            choice.name if isinstance(choice, enum.Enum) else _json_value(choice)
            for choice in action.choices
        ]
    return {
        "options": list(action.option_strings),
        "dest": action.dest,
        "action": ARGPARSE_ACTIONS.get(type(action), f"custom:{type(action).__name__}"),
        "nargs": action.nargs,
        "type": _type_name(action),
        "choices": choices,
        "default": _json_value(action.default),
        "const": _json_value(action.const),
    }


def _parser_record(parser: argparse.ArgumentParser) -> dict[str, Any]:
    return {
        "allow_abbrev": parser.allow_abbrev,
        "defaults": {key: _json_value(value) for key, value in parser._defaults.items()},
        "actions": [
            _action_record(action)
            for action in parser._actions
            if not isinstance(action, argparse._HelpAction)
        ],
    }


def _literal_parser(function: Any, name: str) -> dict[str, Any]:
    """The parser a function builds in variable `name` from literal calls (its source)."""
    tree = ast.parse(inspect.getsource(function))
    options: dict[str, Any] = {"allow_abbrev": True}
    calls = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "attr", "") == "ArgumentParser"
            and any(getattr(target, "id", "") == name for target in node.targets)
        ):
            for keyword in node.value.keywords:
                if keyword.arg == "allow_abbrev":
                    options["allow_abbrev"] = ast.literal_eval(keyword.value)
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "add_argument"
            and getattr(node.func.value, "id", "") == name  # type: ignore[attr-defined]
        ):
            calls.append(node)
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=options["allow_abbrev"])
    for call in sorted(calls, key=lambda node: (node.lineno, node.col_offset)):
        flags = [ast.literal_eval(item) for item in call.args]
        keywords: dict[str, Any] = {}
        for keyword in call.keywords:
            if keyword.arg == "type":
                keywords["type"] = {"int": int, "str": str, "float": float}[keyword.value.id]  # type: ignore[attr-defined]
            else:
                keywords[str(keyword.arg)] = ast.literal_eval(keyword.value)
        parser.add_argument(*flags, **keywords)
    return _parser_record(parser)


def parsers() -> dict[str, Any]:
    """The four parsers slime's `parse_args` runs over train.py's argv, built as slime builds
    them (slime/utils/arguments.py `parse_args`; Megatron-LM megatron/training/arguments.py
    `parse_args`; slime/backends/sglang_utils/arguments.py `sglang_parse_args`)."""
    from megatron.training.arguments import add_megatron_arguments
    from slime.backends.sglang_utils import arguments as sglang_arguments
    from slime.utils import arguments

    megatron = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    add_megatron_arguments(megatron)
    arguments.get_slime_extra_args_provider()(megatron)
    sglang = argparse.ArgumentParser(add_help=False)
    sglang_arguments.add_sglang_arguments(sglang)
    return {
        "pre": _literal_parser(arguments._pre_parse_mode, "temp_parser"),
        "sglang_tp": _literal_parser(sglang_arguments.sglang_parse_args, "temp_parser"),
        "sglang": _parser_record(sglang),
        "megatron": _parser_record(megatron),
    }


def collect() -> dict[str, list[str]]:
    from megatron.training.arguments import add_megatron_arguments
    from slime.backends.sglang_utils.arguments import add_sglang_arguments
    from slime.utils.arguments import get_slime_extra_args_provider

    flags: dict[str, list[str]] = {}
    megatron = argparse.ArgumentParser(allow_abbrev=False, conflict_handler="resolve")
    add_megatron_arguments(megatron)
    for flag, kind in _options(megatron).items():
        flags[flag] = ["megatron", kind]
    get_slime_extra_args_provider()(megatron)  # slime's flags (and its reset_arg redefinitions)
    for flag, kind in _options(megatron).items():
        owner = flags.get(flag, ["slime"])[0]
        flags[flag] = [owner, kind]
    sglang = argparse.ArgumentParser(allow_abbrev=False)
    add_sglang_arguments(sglang)
    for flag, kind in _options(sglang).items():
        owner = "sglang" if flag.startswith("--sglang-") else "router"
        if flag.startswith("--sglang-router-") or flag == "--sglang-server-concurrency":
            owner = "slime"  # slime's own, beside the wrapped ones
        flags.setdefault(flag, [owner, kind])
    for flag, kind in _pre_parsed_flags().items():
        flags.setdefault(flag, ["slime", kind])
    return dict(sorted(flags.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slime-commit", required=True)
    parser.add_argument("--megatron-commit", required=True)
    parser.add_argument("--megatron-patch", default="slime docker/patch/latest/megatron.patch")
    parser.add_argument("--sglang-version", required=True)
    parser.add_argument("--router-version", required=True)
    parser.add_argument("--stub", default="", help="comma-separated modules to stub (CPU only)")
    args = parser.parse_args()
    stubs = {name for name in args.stub.split(",") if name}
    if stubs:
        sys.meta_path.insert(0, _Stubs(stubs))
    flags = collect()
    document = {
        "generated_by": "scripts/slime_flags.py",
        "sources": {
            "slime": {"repository": "THUDM/slime", "commit": args.slime_commit},
            "megatron": {
                "repository": "NVIDIA/Megatron-LM",
                "commit": args.megatron_commit,
                "patch": args.megatron_patch,
            },
            "sglang": {"package": "sglang", "version": args.sglang_version},
            "router": {"package": "sglang-router", "version": args.router_version},
        },
        "stubbed_imports": sorted(stubs),
        "count": len(flags),
        "flags": flags,
    }
    text = json.dumps(document, indent=1)
    sys.stdout.write(f"{text[:-2]},\n {json.dumps('parsers')}: {_parsers_text(parsers())}\n}}\n")


def _parsers_text(found: dict[str, Any]) -> str:
    """The parsers' record, one action a line (a diff at a re-pin shows which changed)."""
    parts = []
    for name, parser in found.items():
        actions = ",\n".join(f"    {json.dumps(action)}" for action in parser["actions"])
        head = json.dumps({key: value for key, value in parser.items() if key != "actions"})
        parts.append(f'  {json.dumps(name)}: {head[:-1]}, "actions": [\n{actions}\n  ]}}')
    return "{\n" + ",\n".join(parts) + "\n }"


if __name__ == "__main__":
    main()
