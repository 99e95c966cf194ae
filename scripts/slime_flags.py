"""Write the list of every flag slime's train.py accepts at the pinned commits (slurm/slime_flags.json).

slime silently ignores a flag it does not know (a misspelled or removed one is never
reported), so the launcher checks every flag it emits, and every `extra_args` flag, against
this list before anything is submitted. slime parses with two parsers
(slime/utils/arguments.py, `parse_args`): SGLang's, built by slime's wrapper
(`add_sglang_arguments`: ServerArgs under --sglang-*, the router's --router-*, slime's own
--sglang-router-*), and Megatron-LM's with slime's flags added
(`megatron.training.arguments.add_megatron_arguments`, then `get_slime_extra_args_provider`),
plus four flags it pre-parses (`_pre_parse_mode`). This script builds those parsers as slime
does and lists their option strings, so it runs where slime, Megatron-LM and SGLang import:

- in the training image: `python scripts/slime_flags.py --slime-commit … > slurm/slime_flags.json`
- on a CPU machine: slime and Megatron-LM checkouts at their commits (with slime's
  docker/patch/latest/megatron.patch applied, as slime's image does) and sglang and
  sglang-router installed without their CUDA dependencies on PYTHONPATH, and `--stub
  torchvision` (SGLang imports it at start; it adds no flag). That is how the committed list
  was made; see its "sources".

The output names, for each flag, the parser that defines it (slime, megatron, sglang, router)
and whether it takes a value ("value") or none ("switch").
"""

from __future__ import annotations

import argparse
import ast
import importlib.abc
import importlib.machinery
import inspect
import json
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
    json.dump(document, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
