"""At submit, the image's labels against the launcher's code (slurm/launch/image_labels.py): the labels
as `apptainer inspect --json --labels` prints them (apptainer is not installed here: its output
shape is recorded below from apptainer's pkg/inspect/metadata.go, and a stand-in executable
prints it for the command-line tests), the code compared in real git repositories."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurm.launch.image_labels import (
    CODE,
    LabelsUnreadable,
    checkout_difference,
    difference,
    labels_from_inspect,
    version_difference,
)
from tests.helpers import DEEPDIVE

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "configs" / "cluster-local.toml"
# the comparison with a checkout is git's (the CPU image, where the container CI runs, has none)
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def inspect_output(labels: dict[str, str]) -> str:
    """What `apptainer inspect --json --labels IMAGE` prints: json.MarshalIndent of Metadata,
    tab-indented, data.attributes.labels beside the label-schema keys Apptainer adds itself."""
    document = {
        "data": {
            "attributes": {
                "labels": {
                    "org.label-schema.build-arch": "amd64",
                    "org.label-schema.build-date": "Monday_10_August_2026_12:00:00_UTC",
                    "org.label-schema.schema-version": "1.0",
                    "org.label-schema.usage.apptainer.version": "1.4.1",
                    "org.label-schema.usage.singularity.deffile.bootstrap": "docker",
                    **labels,
                }
            }
        },
        "type": "container",
    }
    return json.dumps(document, indent="\t")


def git(root: Path, *arguments: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root), *arguments],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A project checkout: code, docs, configs, one commit."""
    root = tmp_path / "checkout"
    for name in ("slurm/cli.py", "deepdive/generate.py", "README.md", "configs/a.toml"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    (root / ".gitignore").write_text("__pycache__/\n")
    git(tmp_path, "init", "-q", str(root))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


def commit(root: Path, name: str, text: str) -> str:
    (root / name).write_text(text)
    git(root, "commit", "-q", "-am", f"change {name}")
    return git(root, "rev-parse", "HEAD")


def test_the_labels_are_read_from_apptainers_inspect_document() -> None:
    labels = labels_from_inspect(inspect_output({"org.opencontainers.image.revision": "abc"}))
    assert labels["org.opencontainers.image.revision"] == "abc"
    assert labels_from_inspect('{"data": {"attributes": {}}, "type": "container"}') == {}


@pytest.mark.parametrize(
    "output", ["", "FATAL: could not open image", "[]", '{"data": {}}', '{"data": {"attributes": {"labels": [1]}}}']
)  # fmt: skip
def test_anything_else_is_named_unreadable(output: str) -> None:
    with pytest.raises(LabelsUnreadable):
        labels_from_inspect(output)


@needs_git
def test_an_image_of_head_matches(checkout: Path) -> None:
    assert checkout_difference(checkout, git(checkout, "rev-parse", "HEAD")) is None


@needs_git
def test_a_later_commit_outside_the_code_still_matches(checkout: Path) -> None:
    built = git(checkout, "rev-parse", "HEAD")
    commit(checkout, "README.md", "new docs\n")
    commit(checkout, "configs/a.toml", "x = 1\n")
    assert checkout_difference(checkout, built) is None
    assert {"slurm", "deepdive", "services"} <= set(CODE)


@needs_git
def test_a_later_commit_to_the_code_does_not(checkout: Path) -> None:
    built = git(checkout, "rev-parse", "HEAD")
    head = commit(checkout, "slurm/cli.py", "changed = True\n")
    found = checkout_difference(checkout, built)
    assert found == f"the image was built from {built}; the checkout's code differs at {head}"


@needs_git
def test_uncommitted_code_is_in_no_image(checkout: Path) -> None:
    built = git(checkout, "rev-parse", "HEAD")
    (checkout / "deepdive" / "new_module.py").write_text("x = 1\n")  # untracked, not ignored
    found = checkout_difference(checkout, built)
    assert found is not None and "uncommitted changes to its code" in found
    (checkout / "deepdive" / "new_module.py").unlink()
    (checkout / "slurm" / "cli.py").write_text("edited = True\n")
    assert "uncommitted" in str(checkout_difference(checkout, built))


@needs_git
@pytest.mark.parametrize(
    ("label", "says"),
    [
        ("0123456789abcdef0123456789abcdef01234567", "which this checkout does not have"),
        ("unknown", "not a commit"),
        ("", "not a commit"),
        ("--output=/tmp/x", "not a commit"),  # never handed to git as an option
    ],
)
def test_a_revision_the_checkout_cannot_compare_is_named(
    checkout: Path, label: str, says: str
) -> None:
    assert says in str(checkout_difference(checkout, label))


def test_from_an_installed_package_the_version_is_compared(tmp_path: Path) -> None:
    installed = importlib.metadata.version("deepdive-slurm")
    assert version_difference(installed) is None
    assert version_difference("0.0.0-other") == (
        f"the image holds deepdive-slurm 0.0.0-other, this launcher {installed}"
    )
    # a launcher outside any checkout (site-packages) compares versions, not revisions
    labels = {
        "org.opencontainers.image.revision": "abc",
        "org.opencontainers.image.version": installed,
    }
    assert difference(labels, tmp_path) is None


def submit(tmp_path: Path, apptainer: str, *args: str) -> subprocess.CompletedProcess[str]:
    image = tmp_path / "train.sif"
    image.write_bytes(b"not an image: the stand-in apptainer answers for it")
    return subprocess.run(
        [*DEEPDIVE, "submit", str(SHIPPED), "--dry-run", "--set", f'container.image="{image}"',
         "--set", f'container.apptainer="{apptainer}"', *args],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def stand_in_apptainer(tmp_path: Path, labels: dict[str, str]) -> Path:
    """An executable answering `inspect --json --labels IMAGE` as apptainer does."""
    record = tmp_path / "inspect.json"
    record.write_text(inspect_output(labels))
    tool = tmp_path / "apptainer"
    tool.write_text(
        f'#!/bin/sh\n[ "$1 $2 $3" = "inspect --json --labels" ] || exit 64\ncat "{record}"\n'
    )
    tool.chmod(0o755)
    return tool


@needs_git
def test_submit_refuses_an_image_of_other_code_unless_told(tmp_path: Path) -> None:
    other = "0123456789abcdef0123456789abcdef01234567"  # no commit of this checkout
    tool = stand_in_apptainer(tmp_path, {"org.opencontainers.image.revision": other})
    refused = submit(tmp_path, str(tool))
    assert refused.returncode == 2
    assert f"the image was built from {other}, which this checkout does not have" in refused.stderr
    assert "--allow-image-mismatch" in refused.stderr and refused.stdout == ""
    allowed = submit(tmp_path, str(tool), "--allow-image-mismatch")
    assert allowed.returncode == 0, allowed.stderr
    assert "deepdive: warning:" in allowed.stderr and "submitting anyway" in allowed.stderr
    assert "#SBATCH" in allowed.stdout


def test_submit_says_when_the_labels_cannot_be_read(tmp_path: Path) -> None:
    result = submit(tmp_path, str(tmp_path / "no-apptainer-here"))
    assert result.returncode == 0, result.stderr
    assert "its labels were not compared" in result.stderr and "is not installed" in result.stderr
