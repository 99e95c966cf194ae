"""flake.nix, checked as far as an offline nix allows (nixpkgs cannot be fetched here): it
evaluates against a stand-in nixpkgs (tests/nix/stub-nixpkgs) — `nix flake show`, `nix flake
check --no-build` —, its dev shell holds every tool the Makefile and CI call and syncs .venv
from the lock on entry, and flake.lock pins the revision flake.nix names."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "tests" / "nix" / "stub-nixpkgs"
# a command the Makefile or .ci/run runs -> the nixpkgs package that provides it
PROVIDERS = {
    "python3": "python311",
    "uv": "uv",
    "make": "gnumake",
    "git": "git",
    "wrk": "wrk",
    "apptainer": "apptainer",
    "podman": "podman",
    "debootstrap": "debootstrap",
    "sbatch": "slurm",
    "munged": "munge",
    "ruff": "ruff",
    "mypy": "mypy",
}

pytestmark = pytest.mark.skipif(
    shutil.which("nix") is None,
    reason="nix is not installed (as root, `apt-get install nix-bin`; make test does)",
)


def nix(tmp_path: Path, *args: str) -> str:
    registry = tmp_path / "registry.json"
    registry.write_text('{"flakes": [], "version": 2}')
    command = ["nix", "--extra-experimental-features", "nix-command flakes", *args]
    command += ["--option", "substituters", "", "--option", "flake-registry", str(registry)]
    command += ["--no-write-lock-file", "--override-input", "nixpkgs", f"path:{STUB}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


@pytest.fixture
def flake(tmp_path: Path) -> str:
    """The project's flake files alone (a path flake copies its whole folder into the store)."""
    folder = tmp_path / "flake"
    folder.mkdir()
    for name in ("flake.nix", "flake.lock", "Makefile", "requirements.lock"):
        shutil.copy(ROOT / name, folder / name)
    return f"path:{folder}"


def test_the_flake_has_a_shell_checks_and_a_formatter_for_both_systems(
    tmp_path: Path, flake: str
) -> None:
    shown = json.loads(nix(tmp_path, "flake", "show", "--json", flake))
    for system in ("x86_64-linux", "aarch64-linux"):
        assert shown["devShells"][system]["default"]["name"] == "deepdive-slurm"
        assert "lint" in shown["checks"][system]
        assert shown["formatter"][system]["type"] == "derivation"
    nix(tmp_path, "flake", "check", "--no-build", flake)  # every output evaluates


def test_the_shell_has_every_tool_the_makefile_and_ci_call(tmp_path: Path, flake: str) -> None:
    names = json.loads(
        nix(tmp_path, "eval", "--json", f"{flake}#devShells.x86_64-linux.default.packageNames")
    )
    called = set()
    for path in (ROOT / "Makefile", ROOT / ".ci" / "run", ROOT / "scripts" / "local-slurm.sh"):
        for command in PROVIDERS:
            if re.search(
                rf"(^|[\s(`$/]){re.escape(command)}(\s|$)", path.read_text(), re.MULTILINE
            ):
                called.add(command)
    assert {"python3", "make", "wrk", "sbatch"} <= called  # the scan finds what it should
    missing = sorted(command for command in called if PROVIDERS[command] not in names)
    assert not missing, f"the dev shell lacks {missing}"


def test_entering_the_shell_syncs_the_venv_from_the_lock(tmp_path: Path, flake: str) -> None:
    hook = json.loads(
        nix(tmp_path, "eval", "--json", f"{flake}#devShells.x86_64-linux.default.shellHook")
    )
    assert "requirements.lock -nt .venv/.installed-stamp" in hook and "make setup" in hook
    assert "python3.11" in hook  # the shell's own Python builds .venv


def test_the_lock_pins_the_revision_flake_nix_names() -> None:
    url = re.search(
        r'inputs\.nixpkgs\.url = "github:NixOS/nixpkgs/([0-9a-f]{40})"',
        (ROOT / "flake.nix").read_text(),
    )
    assert url is not None, "nixpkgs must be pinned by revision"
    locked = json.loads((ROOT / "flake.lock").read_text())["nodes"]["nixpkgs"]["locked"]
    assert locked["rev"] == url.group(1) and locked["narHash"].startswith("sha256-")
