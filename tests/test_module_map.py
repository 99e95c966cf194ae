"""docs/layout.md's module map names every module, so a reader can find the file for a job and
the job of a file: each .py under the folders below (a package's `__init__.py` only when it
holds more than its docstring) is named there, and every module named there exists.

A name is a `backticked` path ending in .py, read against where it is written: a path from
the repository's root anywhere; else, under a `### \\`folder/\\`` heading or in a table row whose
first cell names `folder/`, the path from that folder (`serving/heap.py`, `heap.py` once no
other module under it has that name). A name that fits two modules is reported: write more of
its path.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"
MAPPED = ("deepdive", "services", "slurm", "fakes", "benchmarks", "scripts", "containers")
_SPAN = re.compile(r"`([^`\s]+)`")
_FOLDER = re.compile(r"^[\w./-]+/$")


def python_files(root: Path) -> set[str]:
    """Every .py file under `root`, as a path from it (hidden folders such as .venv left out)."""
    found: set[str] = set()
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [
            name for name in subfolders if not name.startswith(".") and name != "__pycache__"
        ]
        found.update(
            (Path(folder) / name).relative_to(root).as_posix()
            for name in files
            if name.endswith(".py")
        )
    return found


def _only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def mapped_modules(root: Path, files: set[str]) -> set[str]:
    """The modules the map must name: those under MAPPED, docstring-only `__init__.py` aside."""
    return {
        path
        for path in files
        if path.split("/", 1)[0] in MAPPED
        and not (path.endswith("__init__.py") and _only_a_docstring(root / path))
    }


def _folders(text: str) -> list[str]:
    return [span for span in _SPAN.findall(text) if _FOLDER.match(span)]


def read_map(page: str, files: set[str]) -> tuple[set[str], list[str]]:
    """The modules the page's module map names, and each name that fits none or several."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "## The module map")
    named: set[str] = set()
    problems: list[str] = []
    heading: list[str] = []
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if line.startswith("### "):
            heading = _folders(line)
        cells = line.split("|")
        context = (_folders(cells[1]) if line.startswith("|") and len(cells) > 2 else []) or heading
        for name in _SPAN.findall(line):
            if not name.endswith(".py"):
                continue
            if name in files:
                named.add(name)
                continue
            direct = {folder + name for folder in context if folder + name in files}
            deeper = {
                path
                for folder in context
                for path in files
                if path.startswith(folder) and path.endswith("/" + name)
            }
            fits = direct or deeper
            if len(fits) == 1:
                named |= fits
            elif fits:
                problems.append(f"`{name}` fits {sorted(fits)}: write more of its path")
            else:
                problems.append(f"`{name}` (under {context or 'the root'}) is no module")
    return named, problems


def test_every_module_is_in_the_module_map() -> None:
    files = python_files(ROOT)
    named, _ = read_map(LAYOUT.read_text(encoding="utf-8"), files)
    missing = sorted(mapped_modules(ROOT, files) - named)
    assert missing == [], (
        "docs/layout.md's module map does not name these modules (add each with its job, "
        "from its docstring):\n" + "\n".join(missing)
    )


def test_every_module_the_map_names_exists() -> None:
    _, problems = read_map(LAYOUT.read_text(encoding="utf-8"), python_files(ROOT))
    assert problems == [], "docs/layout.md's module map:\n" + "\n".join(problems)


def test_the_map_reader(tmp_path: Path) -> None:
    """Names from the root, a heading's folder and a table row's folder are read, a docstring
    -only `__init__.py` is not required, and names that fit none or two are reported."""
    for path, text in {
        "slurm/a.py": "",
        "slurm/deep/b.py": "",
        "slurm/x/app.py": "",
        "slurm/y/app.py": "",
        "slurm/__init__.py": '"""only a docstring"""\n',
        "fakes/__init__.py": "VALUE = 1\n",
        "fakes/c.py": "",
        "tests/helpers.py": "",
    }.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "hidden.py").write_text("")
    page = (
        "`slurm/y/app.py` before the map is not read\n"
        "## The module map\n"
        "| `fakes/` | `c.py` |\n"
        "| `tests/` | `helpers.py` |\n"
        "### `slurm/`\n"
        "`a.py`, `b.py`, `app.py`, `gone.py`, `fakes/__init__.py`\n"
        "## Elsewhere\n"
        "`slurm/x/app.py`\n"
    )
    files = python_files(tmp_path)
    assert "slurm/__init__.py" not in mapped_modules(tmp_path, files)
    assert ".venv/hidden.py" not in files
    named, problems = read_map(page, files)
    assert named == {
        "fakes/c.py",
        "tests/helpers.py",
        "slurm/a.py",
        "slurm/deep/b.py",
        "fakes/__init__.py",
    }
    assert sorted(mapped_modules(tmp_path, files) - named) == ["slurm/x/app.py", "slurm/y/app.py"]
    assert problems == [
        "`app.py` fits ['slurm/x/app.py', 'slurm/y/app.py']: write more of its path",
        "`gone.py` (under ['slurm/']) is no module",
    ]


WHERE = ROOT / "docs" / "where-does-it-go.md"
_PLACEHOLDER = re.compile(r"[A-Z]{4,}|\*")  # `fakes/NAME.py`, `tests/PACKAGE/test_*.py`


def test_where_does_it_go_names_paths_that_exist_and_a_test_for_each_answer() -> None:
    """docs/where-does-it-go.md's paths are real (a placeholder such as NAME aside), and each
    answer of its table names the test that checks it."""
    page = WHERE.read_text(encoding="utf-8")
    paths = [
        span
        for span in _SPAN.findall(page)
        if "/" in span and span.endswith((".py", "/")) and not _PLACEHOLDER.search(span)
    ]
    assert paths, "the page names no path"
    assert [path for path in paths if not (ROOT / path).exists()] == []
    rows = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line][1:]
    untested = [
        row.split("|")[1].strip()
        for row in rows
        if not any(
            span.startswith("tests/") and span.rsplit("/", 1)[-1].startswith("test_")
            for span in _SPAN.findall(row.split("|")[-2])
        )
    ]
    assert len(rows) >= 10 and untested == []
