"""The project's promises about itself: layout, README's first screen, CI entry, container pins."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_layout_the_user_asked_for() -> None:
    for name in (
        "flake.nix",
        "containers",
        "slurm",
        "deepdive",
        "services",
        "tests",
        "Makefile",
        "README.md",
        "pyproject.toml",
        ".ci/run",
    ):
        assert (ROOT / name).exists(), name


def test_readme_first_screen_gives_the_two_commands() -> None:
    first_screen = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    assert "make run" in first_screen and "make test" in first_screen


def test_ci_runs_the_readme_test_command() -> None:
    assert "make test" in (ROOT / ".ci/run").read_text()


def test_one_console_script_named_deepdive() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {"deepdive": "slurm.cli:main"}
