"""flake.nix, checked as far as an offline nix allows (nixpkgs cannot be fetched here): it
evaluates against a stand-in nixpkgs (tests/nix/stub-nixpkgs) — `nix flake show`, `nix flake
check --no-build` —, its dev shell holds every tool the Makefile and CI call and syncs .venv
from the lock on entry, and flake.lock pins the revision flake.nix names."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
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
}
# commands the lock provides, in .venv: the dev shell must not bring nixpkgs' other versions
FROM_THE_LOCK = ("ruff", "mypy", "pytest")

pytestmark = pytest.mark.skipif(
    shutil.which("nix") is None,
    reason="nix is not installed (as root, `apt-get install nix-bin`; make test does)",
)


def nix_command(tmp_path: Path, *args: str, nixpkgs: Path = STUB) -> list[str]:
    """nix offline: no substituters, no registry, nixpkgs overridden by a stand-in."""
    registry = tmp_path / "registry.json"
    registry.write_text('{"flakes": [], "version": 2}')
    command = ["nix", "--extra-experimental-features", "nix-command flakes", *args]
    command += ["--option", "substituters", "", "--option", "flake-registry", str(registry)]
    return [*command, "--no-write-lock-file", "--override-input", "nixpkgs", f"path:{nixpkgs}"]


def nix(tmp_path: Path, *args: str, nixpkgs: Path = STUB) -> str:
    command = nix_command(tmp_path, *args, nixpkgs=nixpkgs)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture
def flake(tmp_path: Path) -> str:
    """The project's flake files alone (a path flake copies its whole folder into the store)."""
    folder = tmp_path / "flake"
    folder.mkdir()
    for name in ("flake.nix", "flake.lock", "Makefile", "requirements.lock", "pyproject.toml"):
        shutil.copy(ROOT / name, folder / name)
    (folder / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "dev-shell.sh", folder / "scripts" / "dev-shell.sh")
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
    assert "use flake" in (ROOT / ".envrc").read_text().splitlines()  # direnv users


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
    shadowing = sorted(name for name in FROM_THE_LOCK if name in names)
    assert not shadowing, f"the dev shell brings nixpkgs' {shadowing}, not the lock's"
    lock = (ROOT / "requirements.lock").read_text()
    assert all(re.search(rf"^{name}==", lock, re.MULTILINE) for name in FROM_THE_LOCK)


def test_entering_the_shell_syncs_the_venv_from_the_lock(tmp_path: Path, flake: str) -> None:
    hook = json.loads(
        nix(tmp_path, "eval", "--json", f"{flake}#devShells.x86_64-linux.default.shellHook")
    )
    assert re.fullmatch(r"\s*source /nix/store/[a-z0-9]{32}-dev-shell\.sh\s*", hook), hook
    python = json.loads(
        nix(
            tmp_path,
            "eval",
            "--json",
            f"{flake}#devShells.x86_64-linux.default.DEEPDIVE_SHELL_PYTHON",
        )
    )
    assert python.endswith("/bin/python3.11")  # the shell's own Python builds .venv


def test_the_lock_pins_the_revision_flake_nix_names() -> None:
    url = re.search(
        r'inputs\.nixpkgs\.url = "github:NixOS/nixpkgs/([0-9a-f]{40})"',
        (ROOT / "flake.nix").read_text(),
    )
    assert url is not None, "nixpkgs must be pinned by revision"
    locked = json.loads((ROOT / "flake.lock").read_text())["nodes"]["nixpkgs"]["locked"]
    assert locked["rev"] == url.group(1) and locked["narHash"].startswith("sha256-")


HOST = ROOT / "tests" / "nix" / "host-nixpkgs"
# each package of the buildable stand-in -> the host's commands it wraps
HOST_COMMANDS = {
    "uv": ["uv"],
    "gnumake": ["make"],
    "git": ["git"],
    "slurm": [
        "sbatch",
        "srun",
        "salloc",
        "scontrol",
        "squeue",
        "sinfo",
        "scancel",
        "sacct",
        "slurmctld",
        "slurmd",
    ],
    "munge": ["munge", "unmunge", "munged"],
    "apptainer": ["apptainer"],
    "podman": ["podman"],
    "debootstrap": ["debootstrap"],
    "wrk": ["wrk"],
    "unzip": ["unzip"],
}


def host_library(name: str) -> str:
    """The host's copy of a shared library (ldconfig's cache), for the stand-in to wrap."""
    listing = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True).stdout
    found = re.search(rf"^\s*{re.escape(name)} \(libc6,x86-64\) => (\S+)$", listing, re.MULTILINE)
    assert found is not None, f"this host has no {name}"
    return found.group(1)


def write_host_nixpkgs(folder: Path) -> Path:
    """tests/nix/host-nixpkgs copied to FOLDER with host.json for this machine: a stand-in
    that builds (`python -m tests.test_flake FOLDER` writes one for entering the shell by hand)."""
    shutil.copytree(HOST, folder)
    search = "/usr/sbin:/usr/bin:/sbin:/bin:" + str(Path(sys.executable).parent)
    commands = {
        package: {
            name: found for name in names if (found := shutil.which(name, path=search)) is not None
        }
        for package, names in HOST_COMMANDS.items()
    }
    plugins = next(Path("/usr/lib").glob("*/slurm-wlm"), Path("/usr/lib/slurm"))
    host = {
        "python311": sys.base_prefix,
        "commands": commands,
        "libraries": {
            "libstdcxx": host_library("libstdc++.so.6"),
            "zlib": host_library("libz.so.1"),
        },
        "slurmPlugins": str(plugins),
    }
    (folder / "host.json").write_text(json.dumps(host, indent=1))
    return folder


@pytest.fixture
def host_nixpkgs(tmp_path: Path) -> Path:
    return write_host_nixpkgs(tmp_path / "host-nixpkgs")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of this checkout's files (tracked and new, not ignored): what a user's clone holds."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    folder = tmp_path / "checkout"
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, folder / name)
    return folder


def the_locks_ruff_wheel_in_the_store(tmp_path: Path) -> None:
    """The check's wheel as builtin:fetchurl leaves it in the store. Where its URL is closed
    (here: the index is reached through pip's proxy only), pip downloads the same file and
    `nix-store --add-fixed` puts it at the path its hash names; a wrong file gets another
    path, so the build would still refuse it."""
    flake = (ROOT / "flake.nix").read_text()
    pinned = re.search(r'x86_64-linux = \{\s*url = "([^"]+)";\s*sha256 = "([0-9a-f]{64})";', flake)
    assert pinned is not None, "flake.nix names the x86_64 wheel by url and sha256"
    url, sha256 = pinned.groups()
    name = url.rsplit("/", 1)[1]
    path = subprocess.run(
        ["nix-store", "--print-fixed-path", "sha256", sha256, name],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    if subprocess.run(["nix-store", "--check-validity", path], capture_output=True).returncode == 0:
        return
    version = name.split("-")[1]
    download = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
         "--platform", "musllinux_1_2_x86_64", "-d", str(tmp_path / "wheel"), f"ruff=={version}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if download.returncode != 0:
        pytest.skip(f"the lock's ruff wheel cannot be fetched here: {download.stderr[-500:]}")
    added = subprocess.run(
        ["nix-store", "--add-fixed", "sha256", str(tmp_path / "wheel" / name)],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert added == path, f"pip's {name} is not the file the lock's hash names"


def test_flake_check_builds_the_lint_check_with_the_locks_ruff(
    tmp_path: Path, checkout: Path, host_nixpkgs: Path
) -> None:
    """`nix flake check` builds checks.lint: nixpkgs' ruff (another version, writing its cache
    into the read-only source; the stand-in's behaves so) cannot pass it, the lock's can."""
    the_locks_ruff_wheel_in_the_store(tmp_path)
    nix(tmp_path, "flake", "check", "-L", f"path:{checkout}", nixpkgs=host_nixpkgs)
    log = nix(tmp_path, "log", f"path:{checkout}#checks.x86_64-linux.lint", nixpkgs=host_nixpkgs)
    assert "ruff 0.17.6" in log and "All checks passed!" in log, log


def test_the_lint_checks_ruff_is_the_locks_by_version_and_hash() -> None:
    flake = (ROOT / "flake.nix").read_text()
    version = re.search(r'ruffVersion = "([^"]+)";', flake)
    assert version is not None
    hashes = re.findall(r'sha256 = "([0-9a-f]{64})";', flake)
    assert len(hashes) == 2  # x86_64 and aarch64 Linux
    lock = (ROOT / "requirements.lock").read_text()
    pinned = re.search(
        rf"^ruff=={re.escape(version.group(1))} ((?:\\\n\s+--hash=sha256:\w+ ?)+)",
        lock,
        re.MULTILINE,
    )
    assert pinned is not None, f"the lock does not pin ruff=={version.group(1)}"
    assert set(hashes) <= set(re.findall(r"sha256:(\w+)", pinned.group(1)))
    for system, arch in (("x86_64-linux", "x86_64"), ("aarch64-linux", "aarch64")):
        wheel = re.search(rf'{system} = \{{\s*url = "[^"]+/([^"/]+)";', flake)
        assert wheel is not None, system
        assert wheel.group(1) == f"ruff-{version.group(1)}-py3-none-musllinux_1_2_{arch}.whl"


def a_venv(checkout: Path) -> Path:
    """A .venv in the checkout that `make -q setup` finds up to date, holding the lock's
    linters: this test's own environment seen through a .pth (a real `make setup` is the
    slow dev-shell test's job)."""
    venv = checkout / ".venv"
    subprocess.run(
        [f"{sys.base_prefix}/bin/python3.11", "-m", "venv", "--without-pip", venv], check=True
    )
    site = venv / "lib" / "python3.11" / "site-packages"
    outer = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "mypy").is_dir())
    (site / "outer.pth").write_text(outer + "\n")
    mypy = venv / "bin" / "mypy"
    mypy.write_text(
        f"#!{venv}/bin/python\nfrom mypy.__main__ import console_entry\nconsole_entry()\n"
    )
    mypy.chmod(0o755)
    (venv / "bin" / "ruff").symlink_to(Path(sys.executable).parent / "ruff")
    (venv / ".installed-stamp").touch()
    return venv


def develop(
    tmp_path: Path,
    checkout: Path,
    host_nixpkgs: Path,
    folder: Path,
    script: str,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """`nix develop --command bash -c SCRIPT` from FOLDER, as a user types it."""
    command = nix_command(tmp_path, "develop", f"path:{checkout}", nixpkgs=host_nixpkgs)
    command += ["--command", "bash", "-c", script]
    return subprocess.run(
        command,
        cwd=folder,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_shell_runs_the_venvs_linters_from_a_subfolder(
    tmp_path: Path, checkout: Path, host_nixpkgs: Path
) -> None:
    """Entered from deepdive/, the hook finds the checkout; .venv's ruff and mypy run, not
    nixpkgs' (whose setup hooks put their Python 3.12 site-packages on PYTHONPATH)."""
    venv = a_venv(checkout)
    shell = develop(
        tmp_path,
        checkout,
        host_nixpkgs,
        checkout / "deepdive",
        'command -v ruff mypy python; mypy --version; ruff --version; echo "PYTHONPATH=${PYTHONPATH-}"',
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    lines = shell.stdout.splitlines()
    assert lines[:3] == [f"{venv}/bin/ruff", f"{venv}/bin/mypy", f"{venv}/bin/python"], shell.stdout
    lock = (ROOT / "requirements.lock").read_text()
    for name, line in (("mypy", lines[3]), ("ruff", lines[4])):
        version = re.search(rf"^{name}==(\S+)", lock, re.MULTILINE)
        assert version is not None and line.startswith(f"{name} {version.group(1)}"), line
    assert lines[5] == "PYTHONPATH=", shell.stdout
    assert f".venv ready in {checkout}" in shell.stderr


def test_a_venv_whose_interpreter_is_gone_is_rebuilt_and_a_failed_setup_is_said(
    tmp_path: Path, checkout: Path, host_nixpkgs: Path
) -> None:
    """After a pin bump or a garbage collection .venv/bin/python points into a store path that
    is gone: the hook rebuilds .venv with the shell's Python, runs `make setup`, and says so
    when that fails (here: no index, so the lock cannot install), the shell still opening."""
    venv = checkout / ".venv"
    (venv / "bin").mkdir(parents=True)
    gone = "/nix/store/00000000000000000000000000000000-python3-3.11.0/bin/python3.11"
    (venv / "bin" / "python").symlink_to(gone)
    (venv / ".installed-stamp").touch()  # up to date, as far as make can tell
    shell = develop(
        tmp_path,
        checkout,
        host_nixpkgs,
        checkout / "docs",
        '../.venv/bin/python -c "import sys; print(sys.version_info[:2])"; echo opened',
        PIP_NO_INDEX="1",  # the lock cannot install: make setup fails after the rebuild
        TORCH="pip",  # installed already: no torch wheel needed for the failure
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert f"interpreter ({gone}) is gone" in shell.stderr, shell.stderr[-3000:]
    assert "make setup failed" in shell.stderr, shell.stderr[-3000:]
    assert shell.stdout.splitlines()[-2:] == ["(3, 11)", "opened"], shell.stdout


def test_the_shell_gives_wheels_their_libraries_and_the_hosts_gpu_driver(
    tmp_path: Path, checkout: Path, host_nixpkgs: Path
) -> None:
    """pip's manylinux wheels find libstdc++ and zlib; the host's libcuda is linked into a
    folder of its own (the host's system folder would shadow the shell's glibc)."""
    a_venv(checkout)
    system = tmp_path / "host-lib"  # a Debian-like system folder with a driver
    system.mkdir()
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libc.so.6"):
        (system / name).write_text("")
    shell = develop(
        tmp_path, checkout, host_nixpkgs, checkout,
        'tr : "\\n" <<<"$LD_LIBRARY_PATH"',
        DEEPDIVE_DRIVER_DIRS=f"{tmp_path}/none {system}",
        TMPDIR=str(tmp_path),
    )  # fmt: skip
    assert shell.returncode == 0, shell.stderr[-3000:]
    folders = shell.stdout.split()
    assert any(Path(f, "libstdc++.so.6").exists() for f in folders), folders
    assert any(Path(f, "libz.so.1").exists() for f in folders), folders
    driver = Path(folders[-1])
    assert sorted(p.name for p in driver.iterdir()) == ["libcuda.so.1", "libnvidia-ml.so.1"]
    assert f"the host's GPU driver from {system}" in shell.stderr


# the tests' own cluster settings (tests/slurm/conftest.py), moved one port over: the shell's
# cluster never meets the session's
CLUSTER_DIR, CTLD_PORT, SLURMD_PORT0 = os.environ.get(
    "DEEPDIVE_TEST_SLURM", "/tmp/deepdive-slurm-tests:16827:16950"
).split(":")


@pytest.mark.skipif(
    bool(os.environ.get("DEEPDIVE_SKIP_SLURM")) or shutil.which("slurmctld") is None,
    reason="no Slurm here (DEEPDIVE_SKIP_SLURM, or Debian's Slurm not installed)",
)
def test_the_shells_slurm_runs_the_private_cluster(
    tmp_path: Path, checkout: Path, host_nixpkgs: Path
) -> None:
    """Inside the shell, scripts/local-slurm.sh runs the shell's daemons (PATH's, with the
    plugins beside them), not Debian's /usr/sbin ones, and a job runs on that cluster."""
    a_venv(checkout)
    cluster = Path(f"{CLUSTER_DIR}-dev-shell")
    shutil.rmtree(cluster, ignore_errors=True)
    env = {
        "DEEPDIVE_SLURM_DIR": str(cluster),
        "CTLD_PORT": str(int(CTLD_PORT) + 1),
        "SLURMD_PORT0": str(int(SLURMD_PORT0) + 10),
    }
    script = """
        set -e
        trap 'scripts/local-slurm.sh down >/dev/null' EXIT
        scripts/local-slurm.sh up >/dev/null
        export SLURM_CONF=$DEEPDIVE_SLURM_DIR/slurm.conf
        echo "daemon=$(command -v slurmctld)"
        pid=$(cat "$DEEPDIVE_SLURM_DIR/slurm/run/slurmctld.pid")
        echo "running=$(tr '\\0' '\\n' < "/proc/$pid/cmdline" | head -1)"
        echo "plugins=$(sed -n 's/^PluginDir=//p' "$SLURM_CONF")"
        sbatch --quiet --wait -o "$DEEPDIVE_SLURM_DIR/job.out" --wrap 'echo $SLURMD_NODENAME'
        echo "ran=$(cat "$DEEPDIVE_SLURM_DIR/job.out")"
    """
    try:
        shell = develop(tmp_path, checkout, host_nixpkgs, checkout, script, **env)
    finally:
        subprocess.run(
            [str(ROOT / "scripts" / "local-slurm.sh"), "down"],
            env={**os.environ, **env}, capture_output=True, timeout=180,
        )  # fmt: skip
    assert shell.returncode == 0, shell.stdout + shell.stderr[-3000:]
    said = dict(line.split("=", 1) for line in shell.stdout.splitlines() if "=" in line)
    daemon = said["daemon"]
    assert daemon.startswith("/nix/store/") and daemon.endswith("-slurm/bin/slurmctld"), daemon
    assert said["running"] == daemon  # not Debian's /usr/sbin/slurmctld
    assert said["plugins"] == str(Path(daemon).parent.parent / "lib" / "slurm"), said
    assert said["ran"] in ("n1", "n2"), said


if __name__ == "__main__":
    print(write_host_nixpkgs(Path(sys.argv[1])))
