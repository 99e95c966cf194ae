"""The images' definitions (containers/): each parses into the sections it needs, every base image
is pinned by digest and every git install by commit (containers/pins.env, the same commits the
slime backend's flag list was read at), every pip install comes from the lock (torch, the
platform's build, and the project itself aside), the labels carry the lock's hash. That the CPU
image builds and the suite passes inside its SIF is `make ci-container` (.ci/run runs it)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTAINERS = ROOT / "containers"
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# the pip installs an image may run, besides the lock's
ALLOWED_PIP = (
    re.compile(r"--upgrade pip\b"),  # the installer itself
    re.compile(
        r'--find-links /tmp/wheels "?(\$\{TORCH\}|\{\{ TORCH \}\})"?'
    ),  # the platform's torch
    re.compile(r"--require-hashes -r /opt/deepdive-slurm/requirements\.lock"),  # the lock
    re.compile(r"--no-deps /opt/deepdive-slurm$"),  # the project, no dependency of its own
    re.compile(r"--no-deps -e /root/Megatron-LM -e /root/slime$"),  # git checkouts at the pins
)


def pins() -> dict[str, str]:
    lines = (CONTAINERS / "pins.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def sections(path: Path) -> dict[str, str]:
    """An Apptainer definition: its header keys and each %section's body."""
    text = path.read_text()
    header = dict(re.findall(r"^(Bootstrap|From):\s*(.+)$", text, re.MULTILINE))
    parts = re.split(r"^%(\w+)\s*$", text, flags=re.MULTILINE)
    return {**header, **{parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}}


@pytest.mark.parametrize(
    ("name", "base"),
    [("train.def", "{{ TRAIN_BASE }}"), ("cpu.def", "{{ CPU_BASE }}")],
)
def test_each_apptainer_definition_has_its_sections(name: str, base: str) -> None:
    found = sections(CONTAINERS / name)
    assert found["Bootstrap"] == "docker" and found["From"].strip() == base
    assert {"arguments", "files", "post", "environment", "labels", "test", "runscript"} <= set(
        found
    )
    assert "exec deepdive" in found["runscript"]
    assert "{{ LOCK_SHA256 }}" in found["labels"] and "{{ REVISION }}" in found["labels"]


def test_the_training_image_labels_every_pin_and_tests_what_it_holds() -> None:
    found = sections(CONTAINERS / "train.def")
    for arg in ("SLIME_COMMIT", "MEGATRON_COMMIT", "SGLANG_VERSION", "TRAIN_BASE"):
        assert f"{{{{ {arg} }}}}" in found["labels"], arg
    for module in ("torch", "sglang", "megatron", "slime", "deepdive"):
        assert re.search(rf"\bimport .*\b{module}\b", found["test"]), module
    assert "device_count" in found["test"]  # GPU visibility
    assert "git -C slime checkout {{ SLIME_COMMIT }}" in found["post"]
    assert "git -C Megatron-LM checkout {{ MEGATRON_COMMIT }}" in found["post"]
    assert "megatron.patch" in found["post"]  # as slime's own image builds Megatron


def test_every_base_is_pinned_by_digest_and_every_git_install_by_commit() -> None:
    pinned = pins()
    assert DIGEST.match(pinned["CPU_BASE_DIGEST"])
    # the training base is a digest, or unresolved and then refused by `make image` (below)
    assert pinned["TRAIN_BASE_DIGEST"] == "" or DIGEST.match(pinned["TRAIN_BASE_DIGEST"])
    assert COMMIT.match(pinned["SLIME_COMMIT"]) and COMMIT.match(pinned["MEGATRON_COMMIT"])
    flags = json.loads((ROOT / "slurm" / "slime_flags.json").read_text())["sources"]
    assert pinned["SLIME_COMMIT"].startswith(flags["slime"]["commit"])  # one slime, everywhere
    assert pinned["MEGATRON_COMMIT"] == flags["megatron"]["commit"]
    assert pinned["SGLANG_VERSION"] == flags["sglang"]["version"]
    containerfile = (CONTAINERS / "Containerfile.cpu").read_text()
    assert re.search(r"^ARG BASE$", containerfile, re.MULTILINE)  # no default: always a pin
    assert all(
        line.split()[1] in ("${BASE}", "${BASE} AS builder") or "${BASE}" in line
        for line in containerfile.splitlines()
        if line.startswith("FROM")
    )


def test_an_unresolved_training_base_is_refused_before_any_build() -> None:
    if pins()["TRAIN_BASE_DIGEST"]:
        pytest.skip("the training base is pinned")
    result = subprocess.run(
        [str(ROOT / "scripts" / "containers.sh"), "train"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        result.returncode == 2
        and "TRAIN_BASE_DIGEST" in result.stderr
        and "make pin-images" in result.stderr
    )


@pytest.mark.parametrize("name", ["Containerfile.cpu", "cpu.def", "train.def"])
def test_every_pip_install_comes_from_the_lock(name: str) -> None:
    text = (CONTAINERS / name).read_text().replace("\\\n", " ")
    installs = re.findall(r"pip install ((?:-q |--quiet |--no-cache-dir )*)([^&\n]+)", text)
    assert installs
    for _, arguments in installs:
        arguments = arguments.strip()
        assert any(rule.search(arguments) for rule in ALLOWED_PIP), (
            f"{name}: pip install {arguments}"
        )
    if name == "train.def":
        assert "install_from_lock.py /opt/deepdive-slurm/requirements.lock" in text


def test_extra_ca_certificates_never_reach_the_cpu_image() -> None:
    stages = (CONTAINERS / "Containerfile.cpu").read_text().split("\nFROM ")[1:]
    assert len(stages) == 2  # a builder, then the image
    assert "ca/" in stages[0] and "ca/" not in stages[1] and "ca-certificates" not in stages[1]


@pytest.mark.skipif(
    not os.access(CONTAINERS, os.W_OK) or shutil.which("git") is None,
    reason="the context is written into the checkout: here it is read-only or without git "
    "(the container CI mounts the project read-only; the host's make test runs this)",
)
def test_the_context_labels_the_lock_it_installs(tmp_path: Path) -> None:
    """What `make image-context` writes: the project as committed and the build arguments,
    among them the lock's hash the labels carry."""
    result = subprocess.run(
        [str(ROOT / "scripts" / "containers.sh"), "context"],
        capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    build = CONTAINERS / "build"
    arguments = dict(line.split("=", 1) for line in (build / "cpu.args").read_text().splitlines())
    lock = hashlib.sha256((ROOT / "requirements.lock").read_bytes()).hexdigest()
    assert arguments["LOCK_SHA256"] == lock
    assert (build / "project" / "requirements.lock").read_bytes() == (
        ROOT / "requirements.lock"
    ).read_bytes()
    assert list((build / "wheels").glob("torch-*.whl"))
    assert not list((build / "ca").iterdir())  # no EXTRA_CA_DIR: no certificate
    train = dict(line.split("=", 1) for line in (build / "train.args").read_text().splitlines())
    assert train["SLIME_COMMIT"] == pins()["SLIME_COMMIT"] and train["LOCK_SHA256"] == lock


def test_install_from_lock_reads_every_pin_with_its_hashes() -> None:
    spec = importlib.util.spec_from_file_location(
        "install_from_lock", CONTAINERS / "install_from_lock.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = module.entries(ROOT / "requirements.lock")
    lock = (ROOT / "requirements.lock").read_text()
    assert len(found) == len(re.findall(r"^[A-Za-z0-9._-]+==", lock, re.MULTILINE))
    assert all(
        hashes and all(h.startswith("--hash=sha256:") for h in hashes) for *_, hashes in found
    )


# A stand-in for Apptainer (not installable on this host; the container CI runs the real one
# inside podman): it records how it was called and what the build context held at that moment.
FAKE_APPTAINER = """#!/bin/sh
{ echo "argv: $*"; echo "cwd: $(pwd)"
  test -f containers/build/project/pyproject.toml && echo "project: yes"
  test -f containers/build/train.args && sed 's/^/args: /' containers/build/train.args
} > "$APPTAINER_RECORD"
"""


@pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("make") is None,
    reason="needs git and make (the build host's tools)",
)
def test_make_image_runs_on_a_fresh_build_host_without_a_venv(tmp_path: Path) -> None:
    """`make image` on a machine that never ran `make setup`: no .venv, no PYTHON, nothing but
    git, make and Apptainer on PATH. The training image's context needs no Python (the torch
    wheel is the CPU image's only)."""
    checkout = tmp_path / "checkout"
    for name in (
        "Makefile", "pyproject.toml", "requirements.lock", "README.md",
        "scripts/containers.sh", "scripts/apt-install.sh", "containers/train.def",
        "containers/install_from_lock.py", "containers/pins.env",
    ):  # fmt: skip
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, checkout / name)
    pinned = (checkout / "containers" / "pins.env").read_text()
    digest = "sha256:" + "0" * 64  # as `make pin-images` would write it
    (checkout / "containers" / "pins.env").write_text(
        re.sub(r"^TRAIN_BASE_DIGEST=.*$", f"TRAIN_BASE_DIGEST={digest}", pinned, flags=re.M)
    )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(checkout)]
    subprocess.run([*git[:5], "init", "-q", str(checkout)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "fresh"], check=True)
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "apptainer").write_text(FAKE_APPTAINER)
    (tools / "apptainer").chmod(0o755)
    record = tmp_path / "apptainer.txt"
    result = subprocess.run(
        ["make", "-C", str(checkout), "image"],
        capture_output=True, text=True, timeout=120,
        env={"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path), "APPTAINER_RECORD": str(record)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert not (checkout / ".venv").exists()
    lines = record.read_text().splitlines()
    build = checkout / "containers" / "build"
    assert lines[0] == (
        f"argv: build --build-arg-file {build}/train.args deepdive-train.sif containers/train.def"
    )
    assert "project: yes" in lines
    assert f"args: TRAIN_BASE={pins()['TRAIN_BASE_TAG']}@{digest}" in lines
