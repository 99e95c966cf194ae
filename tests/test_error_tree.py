"""The error tree drawn in services/base/errors.py is the tree the code defines: every class of
deepdive/, services/, slurm/, fakes/ and benchmarks/ that derives from DeepDiveError, under its
own parent, and nothing else, so the drawing callers read to know what to catch cannot go stale.
And every exception class of those packages is in that tree, or in docs/errors.md's "Outside
the tree" table with the reason it must stay out: a new stray class fails here.

The modules that define errors are found from the source (a class whose base is a class of the
tree, by name), imported, and the tree walked from `DeepDiveError.__subclasses__()`. An
exception class is found from the source too: a base that is a builtin exception, a name
ending in Error or Exception (an upstream's), or another exception class of the project.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

from services.base import errors
from services.base.errors import DeepDiveError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("deepdive", "services", "slurm", "fakes", "benchmarks")
ERRORS_PAGE = ROOT / "docs" / "errors.md"
BUILTIN_EXCEPTIONS = frozenset(
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
)
# | `Name` | `folder/module.py` | why |
_OUTSIDE_ROW = re.compile(r"^\|\s*`(?P<name>\w+)`\s*\|\s*`(?P<path>[\w/]+\.py)`\s*\|")
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


@functools.cache
def sources(root: Path = ROOT) -> dict[str, ast.AST]:
    """Each module of PACKAGES under `root`, parsed, by its dotted name (once a session)."""
    return {
        path.relative_to(root).with_suffix("").as_posix().replace("/", "."): ast.parse(
            path.read_text(encoding="utf-8")
        )
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }


def exception_classes(parsed: dict[str, ast.AST]) -> set[tuple[str, str]]:
    """(module, class) for each class of `parsed` that is an exception, read from the source:
    its base is a builtin exception, an upstream's (a name ending in Error or Exception), or
    one of these classes (found until no more are)."""
    classes = [
        (module.removesuffix(".__init__"), name, bases)
        for module, tree in parsed.items()
        for name, bases in _class_bases(tree)
    ]
    known = set(BUILTIN_EXCEPTIONS)
    found: set[tuple[str, str]] = set()
    grown = True
    while grown:
        grown = False
        for module, name, bases in classes:
            if (module, name) in found:
                continue
            if any(base in known or base.endswith(("Error", "Exception")) for base in bases):
                found.add((module, name))
                known.add(name)
                grown = True
    return found


def outside_the_tree(page: str) -> dict[str, str]:
    """docs/errors.md's "Outside the tree" table: each class named there and its module."""
    rows: dict[str, str] = {}
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "## Outside the tree")
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        match = _OUTSIDE_ROW.match(line)
        if match is not None:
            module = match["path"].removesuffix(".py").replace("/", ".")
            rows[match["name"]] = module.removesuffix(".__init__")
    return rows


def defining_modules() -> set[str]:
    """Every module of the project whose source derives a class from one of the tree's."""
    known, modules = {DeepDiveError.__name__}, set()
    grown = True
    while grown:
        grown = False
        for module, tree in sources().items():
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


def test_every_exception_class_is_in_the_tree_or_listed_outside_it() -> None:
    in_tree = {(module, name) for name, (_, module) in defined().items()}
    listed = {(module, name) for name, module in outside_the_tree(ERRORS_PAGE.read_text()).items()}
    strays = sorted(
        exception_classes(sources()) - in_tree - listed - {(errors.__name__, "DeepDiveError")}
    )
    assert strays == [], (
        "exception classes outside the DeepDiveError tree: derive each from the fitting class of "
        'services/base/errors.py, or list it in docs/errors.md\'s "Outside the tree" table '
        "with why:\n" + "\n".join(f"{module}.{name}" for module, name in strays)
    )


def test_the_outside_table_names_classes_that_exist_outside_the_tree() -> None:
    """A row whose class was moved into the tree, renamed or removed is stale."""
    exceptions = exception_classes(sources())
    in_tree = set(defined())
    stale = [
        f"{module}.{name}"
        for name, module in outside_the_tree(ERRORS_PAGE.read_text()).items()
        if (module, name) not in exceptions or name in in_tree
    ]
    assert outside_the_tree(ERRORS_PAGE.read_text()), "the table was not found"
    assert stale == []


def test_the_scan_finds_a_stray_exception_class(tmp_path: Path) -> None:
    """Each way a class becomes an exception is seen (a scan that found none would pass)."""
    (tmp_path / "slurm").mkdir()
    (tmp_path / "slurm" / "x.py").write_text(
        "import aiohttp\n"
        "class Builtin(RuntimeError): ...\n"
        "class Upstream(aiohttp.ClientError): ...\n"
        "class Grand(Builtin): ...\n"
        "class Tree(ConfigError): ...\n"
        "class Plain: ...\n"
        "def f() -> None:\n"
        "    class Nested(Exception): ...\n"
    )
    assert exception_classes(sources(tmp_path)) == {
        ("slurm.x", name) for name in ("Builtin", "Upstream", "Grand", "Tree", "Nested")
    }


def test_the_outside_table_reader() -> None:
    page = (
        "# x\n\n## Outside the tree\n\n| class | module | why |\n| --- | --- | --- |\n"
        "| `Stop` | `slurm/node/ray_keeper.py` | control flow |\n\n## Exit codes\n"
        "| `Later` | `slurm/x.py` | not this table |\n"
    )
    assert outside_the_tree(page) == {"Stop": "slurm.node.ray_keeper"}


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
