"""The error tree drawn in services/base/errors.py is the tree the code defines: every class of
deepdive/, services/ and slurm/ that derives from DeepDiveError, under its own parent, and
nothing else, so the drawing callers read to know what to catch cannot go stale.

The modules that define errors are found from the source (a class whose base is a class of the
tree, by name), imported, and the tree walked from `DeepDiveError.__subclasses__()`.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

from services.base import errors
from services.base.errors import DeepDiveError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("deepdive", "services", "slurm")
# "│   ├── Name   why" (a class) or "│                 why" (a continuation)
_DRAWN = re.compile(r"^(?P<indent>(?:[│ ]   )*)[├└]── (?P<name>\w+)")


def drawn(doc: str) -> dict[str, tuple[str, str]]:
    """Each class the drawing names: its parent's name and its line."""
    lines = doc.splitlines()
    start = lines.index(DeepDiveError.__name__)
    parents = [DeepDiveError.__name__]
    found: dict[str, tuple[str, str]] = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        match = _DRAWN.match(line)
        if match is None:
            continue
        depth = len(match["indent"]) // 4
        name = match["name"]
        assert name not in found, f"{name} is drawn twice"
        found[name] = (parents[depth], line)
        del parents[depth + 1 :]
        parents.append(name)
    return found


def _class_bases(tree: ast.AST) -> Iterator[tuple[str, list[str]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = [
                base.id if isinstance(base, ast.Name) else base.attr
                for base in node.bases
                if isinstance(base, ast.Name | ast.Attribute)
            ]
            yield node.name, names


def defining_modules() -> set[str]:
    """Every module of the project whose source derives a class from one of the tree's."""
    sources = {
        path.relative_to(ROOT).with_suffix("").as_posix().replace("/", "."): ast.parse(
            path.read_text(encoding="utf-8")
        )
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    known, modules = {DeepDiveError.__name__}, set()
    grown = True
    while grown:
        grown = False
        for module, tree in sources.items():
            for name, bases in _class_bases(tree):
                if name not in known and known.intersection(bases):
                    known.add(name)
                    modules.add(module.removesuffix(".__init__"))
                    grown = True
    return modules


def defined() -> dict[str, tuple[str, str]]:
    """Each class of the project under DeepDiveError: its parent's name and its module."""
    for module in sorted(defining_modules()):
        importlib.import_module(module)
    found: dict[str, tuple[str, str]] = {}
    pending = [DeepDiveError]
    while pending:
        parent = pending.pop()
        for cls in parent.__subclasses__():
            if cls.__module__.split(".")[0] not in PACKAGES:
                continue  # a test's own subclass
            assert found.get(cls.__name__, (None, cls.__module__))[1] == cls.__module__, (
                f"two errors named {cls.__name__}"
            )
            found[cls.__name__] = (parent.__name__, cls.__module__)
            pending.append(cls)
    return found


def test_the_drawing_is_the_tree_the_code_defines() -> None:
    picture = drawn(errors.__doc__ or "")
    code = defined()
    assert {name: parent for name, (parent, _) in picture.items()} == {
        name: parent for name, (parent, _) in code.items()
    }


def test_an_error_defined_beside_its_code_names_its_module_in_the_drawing() -> None:
    picture = drawn(errors.__doc__ or "")
    unnamed = [
        f"{name} ({module})"
        for name, (_, module) in defined().items()
        if module != errors.__name__
        and f"({module.replace('.', '/')}.py)" not in picture.get(name, ("", ""))[1]
    ]
    assert unnamed == []


def test_the_drawing_reader_sees_depth_and_continuations() -> None:
    doc = """x

DeepDiveError
├── A                 one
│                     two
│   ├── B             three
│   │   └── C
│   └── D
└── E
    └── F
"""
    assert {name: parent for name, (parent, _) in drawn(doc).items()} == {
        "A": "DeepDiveError",
        "B": "A",
        "C": "B",
        "D": "A",
        "E": "DeepDiveError",
        "F": "E",
    }
