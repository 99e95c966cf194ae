"""No module but services/serving/uvicorn_internals.py (pinned to one uvicorn minor version,
tests/services/test_uvicorn_pin.py) reaches into uvicorn's or asyncio's internals: their
submodules (uvicorn.protocols..., asyncio.base_events...), their underscored names, or
asyncio's private attributes on its objects (`_asyncio_future_blocking`, `_loop`, ...). What
uvicorn and asyncio document is their top-level names; everything else may change in any
release, so it lives in the one module someone re-reads when the pin moves."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PINNED = ROOT / "services" / "serving" / "uvicorn_internals.py"
SOURCES = ("services", "deepdive", "slurm", "fakes", "benchmarks", "scripts", "tests")
GUARDED = ("uvicorn", "asyncio")
# attributes only asyncio's futures and tasks have (a name as common as `_loop` is left alone:
# our own classes use it)
ASYNCIO_PRIVATE = frozenset(
    {"_asyncio_future_blocking", "_fut_waiter", "_source_traceback", "_log_traceback"}
)


def private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    aliases: dict[str, str] = {}  # local name -> the guarded module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top, _, rest = alias.name.partition(".")
                if top in GUARDED and rest:
                    found.append((node.lineno, f"import {alias.name}"))
                if top in GUARDED:
                    aliases[(alias.asname or alias.name).split(".")[0]] = top
        elif isinstance(node, ast.ImportFrom) and node.module:
            top, _, rest = node.module.partition(".")
            if top not in GUARDED:
                continue
            if rest:
                found.append((node.lineno, f"from {node.module} import ..."))
            found += [
                (node.lineno, f"from {node.module} import {alias.name}")
                for alias in node.names
                if alias.name.startswith("_")
            ]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in aliases:
            if node.attr.startswith("_") or node.attr in ("base_events", "events", "protocols"):
                found.append((node.lineno, f"{base.id}.{node.attr}"))
        elif node.attr in ASYNCIO_PRIVATE:
            found.append((node.lineno, f"._{node.attr.lstrip('_')} (asyncio's)"))
    return found


def python_files() -> list[Path]:
    files = []
    for top in SOURCES:
        files += sorted((ROOT / top).rglob("*.py"))
    return [f for f in files if f != PINNED]


def test_only_the_pinned_module_uses_uvicorn_or_asyncio_internals() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in python_files()
        for line, what in private_uses(ast.parse(path.read_text(), str(path)))
    ]
    assert not found, (
        "uvicorn's or asyncio's internals outside uvicorn_internals.py:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol\n",
        "import uvicorn.server\n",
        "from uvicorn import _types\n",
        "import asyncio\nx = asyncio.base_events.Server\n",
        "import asyncio as aio\naio._get_running_loop()\n",
        "from asyncio.base_events import Server\n",
        "def f(future):\n    future._asyncio_future_blocking = False\n",
    ],
)
def test_the_scan_sees_each_kind_of_private_use(source: str) -> None:
    assert private_uses(ast.parse(source))


def test_the_scan_lets_the_public_names_be() -> None:
    source = (
        "import asyncio\nimport uvicorn\n"
        "uvicorn.Server(uvicorn.Config(None)).run()\n"
        "asyncio.get_running_loop().call_later(1, print)\n"
    )
    assert private_uses(ast.parse(source)) == []
