"""uvicorn is pinned to the one minor version whose internals services/serving/
uvicorn_internals.py subclasses: an upgrade fails here until someone has re-read them in the
new version's source, then moves UVICORN_MINOR and pyproject's pin together."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from services.serving.uvicorn_internals import UVICORN_MINOR

ROOT = Path(__file__).resolve().parents[2]


def minor(text: str) -> str:
    release = Version(text).release
    return f"{release[0]}.{release[1]}"


def test_the_installed_uvicorn_is_the_minor_version_its_internals_were_read_at() -> None:
    installed = version("uvicorn")
    assert minor(installed) == UVICORN_MINOR, (
        f"uvicorn {installed} is installed; services/serving/uvicorn_internals.py was written "
        f"against {UVICORN_MINOR}: re-read what it lists in the new source, then move "
        "UVICORN_MINOR and pyproject's pin"
    )


def test_pyproject_allows_that_minor_version_only() -> None:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [uvicorn] = [Requirement(d) for d in dependencies if Requirement(d).name == "uvicorn"]
    major, minor_number = (int(part) for part in UVICORN_MINOR.split("."))
    inside = [f"{major}.{minor_number}.0", f"{major}.{minor_number}.99"]
    outside = [f"{major}.{minor_number - 1}.99", f"{major}.{minor_number + 1}.0", f"{major + 1}.0"]
    assert all(uvicorn.specifier.contains(v) for v in inside), uvicorn
    assert not any(uvicorn.specifier.contains(v) for v in outside), uvicorn
