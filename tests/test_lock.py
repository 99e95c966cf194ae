"""One lock for the project's Python dependencies (requirements.lock, with hashes): it must
hold a version of every dependency pyproject.toml names that satisfies what pyproject asks,
carry a hash for every pin, leave torch to the platform (the CPU build here, slime's CUDA build
in the training image), and have been written by the command `make lock` runs. One Python floor
everywhere: pyproject's requires-python, ruff's and mypy's target, the lock's --python-version,
and no lower than what the code calls (asyncio.timeout, tomllib: 3.11)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
LOCKED_EXTRAS = ("corpus", "parquet", "local", "test")
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")
# what the standard library gained in 3.11 (a module, or a module's names)
NEW_IN_311: dict[str, set[str] | None] = {
    "tomllib": None,
    "asyncio": {"timeout", "timeout_at", "TaskGroup", "Runner", "Barrier"},
    "typing": {"Self", "LiteralString", "Never", "assert_never", "reveal_type", "Required"},
    "enum": {"StrEnum", "verify", "member", "nonmember"},
    "datetime": {"UTC"},
}


def pins() -> dict[str, list[tuple[Version, str]]]:
    """Package -> every (version, marker) the lock pins it at (a universal lock may pin one
    package twice, for different Pythons)."""
    found: dict[str, list[tuple[Version, str]]] = {}
    for line in LOCK.read_text().splitlines():
        match = PIN.match(line)
        if match:
            name, version, marker = match.groups()
            found.setdefault(canonicalize_name(name), []).append((Version(version), marker or ""))
    return found


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in LOCKED_EXTRAS:
        listed += project["optional-dependencies"][extra]
    return [Requirement(item) for item in listed]


def python_floor() -> str:
    """requires-python's lower bound, as "3.11"."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    match = re.fullmatch(r">=\s*(3\.\d+)", project["requires-python"].strip())
    assert match, f"requires-python: expected '>=3.N', got {project['requires-python']!r}"
    return match.group(1)


def uses_newer_than_310(path: Path) -> list[str]:
    """Where a source file calls what Python 3.10 does not have."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.TryStar):
            found.append(f"{path.name}:{node.lineno} except*")
        names: list[tuple[str, str | None]] = []
        if isinstance(node, ast.Import):
            names = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            names = [(node.value.id, node.attr)]
        for module, name in names:
            new = NEW_IN_311.get(module, set())
            if new is None or (name is not None and name in new):
                line = getattr(node, "lineno", 0)
                found.append(f"{path.name}:{line} {module}{'.' + name if name else ''}")
    return found


def test_one_python_floor_everywhere_and_the_code_needs_no_less() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floor = python_floor()
    assert pyproject["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")
    assert pyproject["tool"]["mypy"]["python_version"] == floor
    command = LOCK.read_text().splitlines()[1].split()
    assert command[command.index("--python-version") + 1] == floor  # the lock `make lock` wrote
    makefile = (ROOT / "Makefile").read_text()
    assert f"--python-version {floor} -o requirements.lock" in makefile
    assert "python_full_version < '" + floor + "'" not in LOCK.read_text()
    newer = [
        use
        for package in ("deepdive", "services", "slurm")
        for path in sorted((ROOT / package).rglob("*.py"))
        for use in uses_newer_than_310(path)
    ]
    if newer:
        assert tuple(map(int, floor.split("."))) >= (3, 11), f"3.11 is needed by: {newer}"


def test_the_scan_finds_what_310_lacks(tmp_path: Path) -> None:
    source = tmp_path / "new.py"
    source.write_text(
        "import asyncio, tomllib\nfrom typing import Self\n"
        "async def f():\n    async with asyncio.timeout(1):\n        pass\n"
        "try:\n    pass\nexcept* ValueError:\n    pass\n"
    )
    assert set(uses_newer_than_310(source)) == {
        "new.py:1 tomllib", "new.py:2 typing.Self", "new.py:4 asyncio.timeout", "new.py:6 except*"
    }  # fmt: skip
    source.write_text("import asyncio\nasyncio.wait_for\nfrom typing import Any\n")
    assert uses_newer_than_310(source) == []


def test_every_dependency_of_pyproject_is_locked_at_a_version_it_accepts() -> None:
    locked = pins()
    missing, wrong = [], []
    for requirement in project_requirements():
        versions = locked.get(canonicalize_name(requirement.name))
        if not versions:
            if requirement.marker is None or requirement.marker.evaluate(
                {"python_version": python_floor()}
            ):
                missing.append(str(requirement))
            continue
        if not any(requirement.specifier.contains(v, prereleases=True) for v, _ in versions):
            wrong.append(f"{requirement} (locked: {', '.join(str(v) for v, _ in versions)})")
    assert not missing, f"not in requirements.lock (run `make lock`): {missing}"
    assert not wrong, f"requirements.lock disagrees with pyproject.toml (run `make lock`): {wrong}"


def test_every_pin_has_hashes_and_torch_is_left_to_the_platform() -> None:
    text = LOCK.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9._-]+==)", text.split("\n", 2)[2])
    for block in blocks:
        assert "--hash=sha256:" in block, block.splitlines()[0]
    assert "torch" not in pins()  # the platform's build: installed before the lock
    assert not any(name.startswith("nvidia-") for name in pins())


def test_the_lock_was_written_by_the_command_make_lock_runs() -> None:
    makefile = (ROOT / "Makefile").read_text()
    extras = re.search(r"^EXTRAS := (.+)$", makefile, re.MULTILINE)
    assert extras is not None
    command = LOCK.read_text().splitlines()[1].strip("# ").split()
    assert command[:3] == ["uv", "pip", "compile"] and "pyproject.toml" in command
    assert " ".join(command).count("--extra") == len(LOCKED_EXTRAS)
    for extra in LOCKED_EXTRAS:
        assert f"--extra {extra}" in " ".join(command) and f"--extra {extra}" in extras.group(1)
    assert "--generate-hashes" in command and "--universal" in command


def test_make_setup_installs_from_the_lock_with_hashes_required() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements.lock" in makefile
    assert "$(STAMP): pyproject.toml requirements.lock" in makefile
