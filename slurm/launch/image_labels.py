"""Before a job with an image is submitted: is the image's deepdive-slurm the code submitting it?

Every node runs the image's copy of the project (it unpickles the job the launcher pickled, and
slime loads our hooks from it), so an image built from another commit runs other code than the
checkout, and the difference shows, if at all, after the job waited in the queue. The image's
labels (`make image` writes them: org.opencontainers.image.revision, the commit it was built
from; org.opencontainers.image.version, the package's version) are read with `apptainer inspect`
and compared with the launcher: from a git checkout, the project's code at the image's revision
and at HEAD plus uncommitted changes (a commit that changed only docs or configs does not
count); from an installed package, its version. A difference refuses the submission unless
--allow-image-mismatch (a deliberate choice: the refusal costs nothing, the mismatch a queue wait
and GPU hours). Labels that cannot be read (no apptainer on this host) are a warning: not
compared, said so.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.base.errors import ConfigError, RuntimeFailure

REVISION = "org.opencontainers.image.revision"
VERSION = "org.opencontainers.image.version"
# what the nodes run from the project (the image installs them; configs travel in the job)
CODE = ("deepdive", "services", "slurm", "pyproject.toml", "requirements.lock")
PACKAGE = "deepdive-slurm"
LAUNCHER = Path(__file__).resolve().parents[2]  # a checkout's root, or site-packages


class LabelsUnreadable(RuntimeFailure):
    """The image's labels could not be read; the sentence says why."""


def labels_from_inspect(output: str) -> dict[str, str]:
    """The labels in `apptainer inspect --json --labels IMAGE`'s output: {"data": {"attributes":
    {"labels": {...}}}, "type": "container"} (apptainer's pkg/inspect/metadata.go)."""
    try:
        document: Any = json.loads(output)
        labels = document["data"]["attributes"].get("labels") or {}
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise LabelsUnreadable(
            f"apptainer inspect printed no label document ({error!r})"
        ) from error
    if not isinstance(labels, dict):
        raise LabelsUnreadable(f"apptainer inspect's labels are not a mapping: {labels!r}")
    return {str(key): str(value) for key, value in labels.items()}


def read_labels(apptainer: str, image: str) -> dict[str, str]:
    command = [apptainer, "inspect", "--json", "--labels", image]
    try:
        result = subprocess.run(  # noqa: S603 (the configured apptainer, fixed arguments)
            command, capture_output=True, text=True, timeout=120, check=False
        )
    except FileNotFoundError as error:
        raise LabelsUnreadable(f"{apptainer} is not installed on this host") from error
    except subprocess.TimeoutExpired as error:
        raise LabelsUnreadable(f"{' '.join(command)} did not answer in 120 s") from error
    if result.returncode != 0:
        raise LabelsUnreadable(
            f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[-500:]}"
        )
    return labels_from_inspect(result.stdout)


def _git(root: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 (git, fixed arguments)
        ["git", "-C", str(root), *arguments],  # noqa: S607 (git from PATH, as the user runs it)
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def checkout_root(package_root: Path) -> Path | None:
    """The git checkout the launcher runs from, or None (an installed package)."""
    try:
        found = _git(package_root, "rev-parse", "--show-toplevel")
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    if found.returncode != 0 or Path(found.stdout.strip()).resolve() != package_root.resolve():
        return None
    return package_root


def checkout_difference(root: Path, image_revision: str) -> str | None:
    """How the checkout's code differs from the image's revision, or None when it does not."""
    head = _git(root, "rev-parse", "HEAD").stdout.strip()
    if not re.fullmatch(r"[0-9a-f]{7,40}", image_revision):
        return (
            f"the image's revision label is {image_revision!r}, not a commit (built without "
            f"`make image`?); the checkout is at {head}"
        )
    compared = _git(root, "diff", "--quiet", image_revision, "HEAD", "--", *CODE)
    if compared.returncode > 1:
        return (
            f"the image was built from {image_revision}, which this checkout does not have "
            f"(git fetch?); the checkout is at {head}"
        )
    if compared.returncode == 1:
        return f"the image was built from {image_revision}; the checkout's code differs at {head}"
    if _git(root, "status", "--porcelain", "--", *CODE).stdout.strip():
        return f"the checkout has uncommitted changes to its code ({', '.join(CODE)}), which no image holds"
    return None


def version_difference(image_version: str) -> str | None:
    try:
        installed = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        installed = "not installed"
    if image_version == installed:
        return None
    return f"the image holds {PACKAGE} {image_version or 'of no version label'}, this launcher {installed}"


def difference(labels: dict[str, str], package_root: Path) -> str | None:
    root = checkout_root(package_root)
    if root is not None:
        return checkout_difference(root, labels.get(REVISION, ""))
    return version_difference(labels.get(VERSION, ""))


def check_image(
    apptainer: str,
    image: str,
    allow_mismatch: bool,
    warn: Callable[[str], None],
    package_root: Path = LAUNCHER,
) -> None:
    """Refuse (ConfigError) an image whose project is not the launcher's, or warn with
    allow_mismatch; warn when the labels cannot be read."""
    try:
        labels = read_labels(apptainer, image)
    except LabelsUnreadable as error:
        warn(f"container.image {image}: its labels were not compared with this code: {error}")
        return
    found = difference(labels, package_root)
    if found is None:
        return
    message = (
        f"container.image {image}: {found}. The nodes run the image's deepdive-slurm, not this "
        "code: rebuild the image (make image)"
    )
    if allow_mismatch:
        warn(message + "; submitting anyway (--allow-image-mismatch)")
        return
    raise ConfigError(message + ", or pass --allow-image-mismatch to submit anyway")
