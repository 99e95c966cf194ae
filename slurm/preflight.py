"""What must exist on disk before a job is submitted: the image, the env file, the model, the
prompt data. Kept apart from the config's own checks (types, ranges, coherence) so that a dry
run can print what would run before anything is downloaded or built, then list what is still
missing; a real submission refuses until the list is empty."""

from __future__ import annotations

import os
from pathlib import Path

from services.exceptions import ConfigError
from services.secrets import TOKEN_ENV, env_file_keys
from slurm.config import ExperimentConfig

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
    if config.run.backend == "slime":
        missing += _slime_inputs(config)
    return [item for item in missing if item.startswith(only)] if only else missing


def _slime_inputs(config: ExperimentConfig) -> list[str]:
    model, rollout = config.slime.model, config.slime.rollout
    missing = []
    if model.hf_checkpoint and not (Path(model.hf_checkpoint) / "config.json").is_file():
        missing.append(
            f"slime.model.hf_checkpoint: {model.hf_checkpoint} has no config.json "
            "(a Hugging Face model folder)"
        )
    if model.ref_load and not Path(model.ref_load).is_dir():
        missing.append(
            f"slime.model.ref_load: {model.ref_load} is not a folder (a torch_dist checkpoint: "
            "deepdive convert-checkpoint to-megatron makes it)"
        )
    if rollout.prompt_data and not Path(rollout.prompt_data).is_file():
        missing.append(
            f"slime.rollout.prompt_data: {rollout.prompt_data}: no such file (deepdive convert)"
        )
    for name, path in sorted(config.slime.eval.sets.items()):
        if not Path(path).is_file():
            missing.append(f"slime.eval.sets.{name}: {path}: no such file")
    return missing


def require_inputs(config: ExperimentConfig, only: tuple[str, ...] = ()) -> None:
    """Refuse a submission whose inputs are not all there, naming every one."""
    missing = missing_inputs(config, only)
    if len(missing) == 1:
        raise ConfigError(missing[0])
    if missing:
        raise ConfigError(f"{len(missing)} inputs are missing: " + "; ".join(missing))
