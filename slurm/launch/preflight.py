"""What must exist on disk before a job is submitted: the image, the env file, and what the
backend reads (the model, the prompt data: `Backend.missing_inputs`), each visible inside the
image at its own path with the configured binds (slurm/launch/image_mounts.py). Kept apart from the config's own checks (types, ranges, coherence) so that a dry
run can print what would run before anything is downloaded or built, then list what is still
missing; a real submission refuses until the list is empty."""

from __future__ import annotations

import os
from pathlib import Path

from services.base.errors import ConfigError
from services.base.secrets import TOKEN_ENV, env_file_keys
from slurm.backends import build_backend
from slurm.config import INPUT_FILES, ExperimentConfig
from slurm.launch.image_mounts import describe, invisible

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def missing_inputs(config: ExperimentConfig, only: tuple[str, ...] = ()) -> list[str]:
    """Every input the job reads that is not there yet, as "key: what is wrong" (`only`: the
    inputs whose keys start so, for a job that reads fewer: a conversion needs no data)."""
    missing = []
    image = config.container.image
    if image and not Path(image).is_file():
        missing.append(f"container.image: {image}: no such file (an Apptainer image, .sif)")
    keys: set[str] = set()
    if config.services.env_file:
        try:  # its names only: the values are read on the nodes, never here
            keys = env_file_keys(Path(config.services.env_file))
        except ConfigError as error:
            missing.append(f"services.env_file: {error.message}")
            keys = {TOKEN_ENV}  # said once: the file itself is what is missing
    host = config.services.host
    if host not in LOOPBACK and TOKEN_ENV not in keys and not os.environ.get(TOKEN_ENV):
        missing.append(
            f"services.host: {host!r} serves the other nodes, which needs {TOKEN_ENV} (the "
            "services refuse to start without it): put it in services.env_file, or set "
            'services.host = "127.0.0.1" on one node'
        )
    backend = build_backend(config)
    missing += backend.missing_inputs()
    missing += hidden_from_image(config, backend.input_paths())
    return [item for item in missing if item.startswith(only)] if only else missing


def hidden_from_image(config: ExperimentConfig, backend_paths: dict[str, str]) -> list[str]:
    """Every path the job reads that the image would not show at that path (slurm/launch/image_mounts.py),
    as "key: what is wrong"."""
    container = config.container
    if not container.image:
        return []
    paths = dict(backend_paths)
    if config.services.env_file:
        paths["services.env_file"] = config.services.env_file
    for key in INPUT_FILES:
        named = config.services.tools.get(key)
        if isinstance(named, str) and named:
            paths[f"services.tools.{key}"] = named
    shown = describe(config.run.folder, container)
    return [
        f"{key}: {path} is not visible inside the image (bound: {shown}; the site's own "
        "Apptainer binds are not known here): add it, or a folder above it, to container.binds"
        for key, path in invisible(paths, config.run.folder, container)
    ]


def require_inputs(config: ExperimentConfig, only: tuple[str, ...] = ()) -> None:
    """Refuse a submission whose inputs are not all there, naming every one."""
    missing = missing_inputs(config, only)
    if len(missing) == 1:
        raise ConfigError(missing[0])
    if missing:
        raise ConfigError(f"{len(missing)} inputs are missing: " + "; ".join(missing))
