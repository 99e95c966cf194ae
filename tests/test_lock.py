"""One lock for the project's Python dependencies (requirements.lock, with hashes): it must
hold a version of every dependency pyproject.toml names that satisfies what pyproject asks,
carry a hash for every pin, leave torch to the platform (the CPU build here, slime's CUDA build
in the training image), and have been written by the command `make lock` runs."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
LOCKED_EXTRAS = ("corpus", "parquet", "local", "test")
PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


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


def test_every_dependency_of_pyproject_is_locked_at_a_version_it_accepts() -> None:
    locked = pins()
    missing, wrong = [], []
    for requirement in project_requirements():
        versions = locked.get(canonicalize_name(requirement.name))
        if not versions:
            if requirement.marker is None or requirement.marker.evaluate(
                {"python_version": "3.10"}
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
