"""The contract modules (the ones other packages build on) say what they offer in `__all__`,
and `__all__` is what the tree uses: every name in it exists, and every public name any .py
file of the repository imports from one of them is in it. A name taken from a contract module
without being listed there fails here, so the public surface changes on purpose, in review.

Imports are read from the source (`from m import x`, `import m as a` then `a.x`, `from p
import m` then `m.x`, and `p.m.x` written out), never by importing the importer.
"""

from __future__ import annotations

import ast
import importlib
import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import git_ignored

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = (
    "deepdive.protocol",
    "deepdive.rollout_settings",
    "deepdive.service_urls",
    "deepdive.arg_names",
    "services.client.http",
    "services.client.plain_http",
    "services.client.retries",
    "services.base.typed_config",
)


def python_files(root: Path) -> Iterator[Path]:
    """Every .py file of the repository, hidden folders (.venv, .git, caches) and what git
    ignores (containers/build/'s staged copy of the tree) left out."""
    found: list[Path] = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(
            name for name in subfolders if not name.startswith(".") and name != "__pycache__"
        )
        found += (Path(folder) / name for name in sorted(files) if name.endswith(".py"))
    ignored = git_ignored(root, [path.relative_to(root).as_posix() for path in found])
    yield from (path for path in found if path.relative_to(root).as_posix() not in ignored)


def module_name(path: Path, root: Path) -> str:
    return (
        path.relative_to(root)
        .with_suffix("")
        .as_posix()
        .replace("/", ".")
        .removesuffix(".__init__")
    )


def imported_names(
    tree: ast.AST, importer: str, modules: frozenset[str]
) -> Iterator[tuple[str, str]]:
    """(module, name) for each name `tree` takes from one of `modules`; `importer` is the
    module `tree` is (its own names are not imports)."""
    aliases: dict[str, str] = {}  # a local name -> the contract module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if node.module in modules and node.module != importer:
                    yield node.module, alias.name
                if f"{node.module}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node.value)
        if dotted is None:
            continue
        module = aliases.get(dotted, dotted)
        if module in modules and module != importer:
            yield module, node.attr


def _dotted(node: ast.expr) -> str | None:
    """`a.b.c` written out as a string, or None for anything but names and attributes."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def uses(root: Path, modules: frozenset[str]) -> dict[str, dict[str, set[str]]]:
    """For each contract module, each public name the tree takes from it and the files that do."""
    found: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in python_files(root):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for module, name in imported_names(tree, module_name(path, root), modules):
            if not name.startswith("_"):
                found[module][name].add(path.relative_to(root).as_posix())
    return found


def ruff_order(name: str) -> tuple[int, str]:
    """ruff's RUF022 order (isort-style): SCREAMING_CASE, then CamelCase, then the rest."""
    if name.isupper() and len(name) > 1:  # one capital letter is CamelCase to ruff
        return 0, name
    return (1 if name[:1].isupper() else 2), name


def exports(module: str) -> list[str]:
    listed = getattr(importlib.import_module(module), "__all__", None)
    assert isinstance(listed, list), f"{module} has no __all__ list"
    return [str(name) for name in listed]


@pytest.mark.parametrize("module", CONTRACTS)
def test_every_exported_name_exists(module: str) -> None:
    imported = importlib.import_module(module)
    missing = [name for name in exports(module) if not hasattr(imported, name)]
    assert missing == [], f"{module}.__all__ lists names it does not define: {missing}"


@pytest.mark.parametrize("module", CONTRACTS)
def test_exports_are_listed_once_in_ruffs_order(module: str) -> None:
    listed = exports(module)
    assert len(listed) == len(set(listed)), f"{module}.__all__ lists a name twice"
    assert listed == sorted(listed, key=ruff_order)


def test_every_name_the_tree_imports_is_exported() -> None:
    used = uses(ROOT, frozenset(CONTRACTS))
    unlisted = [
        f"{module}.{name} (imported by {', '.join(sorted(files))})"
        for module in CONTRACTS
        for name, files in sorted(used[module].items())
        if name not in exports(module)
    ]
    assert unlisted == [], "add to the module's __all__ or stop importing:\n" + "\n".join(unlisted)


def test_the_scan_sees_every_way_of_importing(tmp_path: Path) -> None:
    """The scan finds each import form (a scan that found none would pass every module)."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "contract.py").write_text("A = 1\n_hidden = 2\nprint(pkg.contract.Own)\n")
    (tmp_path / "user.py").write_text(
        "from pkg.contract import A, _hidden\n"
        "import pkg.contract as c\n"
        "from pkg import contract\n"
        "import pkg.contract\n"
        "c.B, contract.C, pkg.contract.D\n"
    )
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "hidden.py").write_text("from pkg.contract import E\n")
    used = uses(tmp_path, frozenset({"pkg.contract"}))
    assert {name: sorted(files) for name, files in used["pkg.contract"].items()} == {
        "A": ["user.py"],
        "B": ["user.py"],
        "C": ["user.py"],
        "D": ["user.py"],
    }


def test_ruffs_order() -> None:
    assert sorted(
        ["parse", "Upstream", "MAX_HEAD_BYTES", "T", "Failure", "arg_name"], key=ruff_order
    ) == [
        "MAX_HEAD_BYTES",
        "Failure",
        "T",
        "Upstream",
        "arg_name",
        "parse",
    ]
