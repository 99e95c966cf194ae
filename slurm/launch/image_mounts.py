"""Which host paths a job inside the image sees at the same path: what the launcher binds (the
run folder, /dev/shm, `container.binds`) and what Apptainer mounts by default ($HOME and /tmp,
unless `container.options` turns them off). The job reads every path of its config where the
host has it (the model, the data, the env file), so each must be visible there at that same
path, or the job fails on its nodes after its wait in the queue.

Apptainer's own defaults (its docs, "Bind Paths and Mounts"): the user's home, /tmp and
/var/tmp, the current directory, and what the site's apptainer.conf adds (`bind path = ...`).
The current directory is the one sbatch ran in and a site's binds are unknown here, so neither
counts: a path they would cover is bound explicitly instead (binding it twice is harmless).
`--contain` (`-c`) drops the home and /tmp; `--no-home` the home; `--no-mount home,tmp` either.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurm.config import ContainerTable

SHM = "/dev/shm"  # noqa: S108 (the host's shared memory, bound for NCCL and Ray)


def bound_paths(run_folder: str, container: ContainerTable) -> list[str]:
    """The binds the launcher passes: the run folder, /dev/shm, then container.binds."""
    return [run_folder, SHM, *container.binds]


def visible_roots(run_folder: str, container: ContainerTable) -> list[str]:
    """Host folders the image shows at their own path (resolved, so a symlinked home counts
    where it really is)."""
    return [os.path.realpath(root) for root in _roots(run_folder, container)]


def describe(run_folder: str, container: ContainerTable) -> str:
    """The folders that count, as a user reads them."""
    return ", ".join(_roots(run_folder, container))


def _roots(run_folder: str, container: ContainerTable) -> list[str]:
    roots = []
    for spec in bound_paths(run_folder, container):
        for item in spec.split(","):  # Apptainer takes "a,b:c" as two binds
            source, _, rest = item.partition(":")
            destination = rest.split(":", 1)[0] if rest else source
            if source and _same(source, destination):
                roots.append(source)
    options = container.options
    no_mount = {
        name
        for option in options
        if option.startswith("--no-mount")
        for name in option.partition("=")[2].split(",")
    }
    contained = any(option in ("--contain", "-c") for option in options)
    if not contained and "--no-home" not in options and "home" not in no_mount:
        roots.append(str(Path.home()))
    if not contained and "tmp" not in no_mount:
        roots += ["/tmp", "/var/tmp"]  # noqa: S108 (Apptainer's default mounts)
    return roots


def _same(source: str, destination: str) -> bool:
    return os.path.normpath(source) == os.path.normpath(destination)


def invisible(
    paths: dict[str, str], run_folder: str, container: ContainerTable
) -> list[tuple[str, str]]:
    """(key, path) of every path the image would not show at that path."""
    roots = visible_roots(run_folder, container)
    hidden = []
    for key, path in paths.items():
        real = os.path.realpath(os.path.expanduser(path))
        if not any(real == root or real.startswith(root.rstrip("/") + "/") for root in roots):
            hidden.append((key, path))
    return hidden
