"""`deepdive eval` of a slime run's checkpoints: each a Hugging Face folder (what `deepdive
convert-checkpoint to-hf` writes), served by SGLang (`python -m sglang.launch_server`: the
training image on a GPU node) with the context training used; `latest` is the conversion of
the newest complete training checkpoint.

A checkpoint whose config.json serves less than an episode needs is refused before anything
starts (slurm/backends/slime/model_context.py), not turn by turn."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services.base.errors import ConfigError
from slurm.backends import Checkpoint, EvalRollout
from slurm.backends.slime.args import sglang_context_length
from slurm.backends.slime.model_context import (
    check_episode_fits,
    model_context,
    read_config,
    served_context,
)
from slurm.config import ExperimentConfig


class SlimeEvalEngine:
    description = "SGLang (python -m sglang.launch_server)"

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config

    def resolve(self, spec: str) -> Checkpoint:
        if spec == "latest":
            from slurm.backends.slime.conversion import converted, iteration_folder

            number, _ = iteration_folder(self.config, "latest")
            path = converted(self.config) / f"iter_{number:07d}_hf"
            if not (path / "config.json").is_file():
                raise ConfigError(
                    f"--checkpoint latest: iteration {number} has no Hugging Face conversion at "
                    f"{path}; run `deepdive convert-checkpoint to-hf CONFIG --iteration {number}`"
                )
            return Checkpoint(f"latest (iter {number})", path, "hf")
        path = Path(spec).expanduser().absolute()
        if (path / "config.json").is_file():
            return Checkpoint(path.name, path, "hf")
        raise ConfigError(f"--checkpoint {spec}: not a Hugging Face model folder (config.json)")

    def check(self, checkpoint: Checkpoint) -> None:
        served_context_for(self.config, checkpoint.path)

    @contextmanager
    def serve(self, checkpoint: Checkpoint, logs: Path) -> Iterator[tuple[str, Any]]:
        from slurm.backends.slime.sglang_server import sglang_server

        context = served_context_for(self.config, checkpoint.path)
        tensor = self.config.slime.resources.rollout_num_gpus_per_engine
        with sglang_server(checkpoint.path, logs / "sglang.log", context, tensor) as url:
            yield url, None  # the rollout loads the tokenizer from args.hf_checkpoint

    def rollout(self) -> EvalRollout:
        slime = self.config.slime
        return EvalRollout(
            slime.deepdive.knobs(), slime.rollout.max_context_len, slime.rollout.max_response_len
        )


def served_context_for(config: ExperimentConfig, model: Path) -> int:
    """The context SGLang serves `model` with for this evaluation (training's), refusing one
    the model's config.json does not allow or that an episode would not fit."""
    slime = config.slime
    context = model_context(read_config(model), str(model / "config.json"))
    served = served_context(context, slime.sglang.context_length, "slime.sglang.context_length")
    check_episode_fits(
        context,
        served,
        slime.rollout.max_context_len,
        slime.rollout.max_response_len,
        "slime.rollout.max_context_len",
        "slime.rollout.max_response_len",
    )
    return sglang_context_length(slime)  # what training's SGLang served (<= `served`)
