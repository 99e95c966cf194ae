"""`deepdive eval` of a local run's checkpoints: each served by the local engine in this process,
a Hugging Face folder (RUN/final_model, or any) or a training checkpoint
(RUN/checkpoints/step-NNNNNN) on the run's base model; `latest` is RUN/final_model, else the
newest step checkpoint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services.base.errors import ConfigError
from slurm.backends import Checkpoint, EvalRollout
from slurm.config import ExperimentConfig, local_run_config


class LocalEvalEngine:
    description = "the local engine"

    def __init__(self, experiment: ExperimentConfig) -> None:
        self.config = local_run_config(experiment)
        self.run = experiment.run_folder

    def resolve(self, spec: str) -> Checkpoint:
        if spec == "latest":
            final = self.run.final_model
            if (final / "config.json").is_file():
                return Checkpoint("latest (final_model)", final, "hf")
            from deepdive.local.checkpoint import checkpoints

            found = checkpoints(self.run.checkpoints)
            if not found:
                raise ConfigError(f"--checkpoint latest: {self.run.root} has no checkpoint yet")
            return Checkpoint(f"latest ({found[-1].name})", found[-1], "step")
        path = Path(spec).expanduser().absolute()
        if (path / "config.json").is_file():
            return Checkpoint(path.name, path, "hf")
        if (path / "state.pt").is_file():
            return Checkpoint(path.name, path, "step")
        raise ConfigError(
            f"--checkpoint {spec}: not a Hugging Face model folder (config.json) nor a "
            "training checkpoint (state.pt)"
        )

    def check(self, checkpoint: Checkpoint) -> None:
        return None  # the engine serves any length the model's positions allow

    @contextmanager
    def serve(self, checkpoint: Checkpoint, logs: Path) -> Iterator[tuple[str, Any]]:
        from deepdive.local.model import load_model
        from deepdive.local.stack import engine_server

        if checkpoint.kind == "step":
            from deepdive.local.checkpoint import load_checkpoint

            model, tokenizer = load_model(self.run.base_model)
            _, state = load_checkpoint(checkpoint.path)
            model.load_state_dict(state["trainer"]["model"])
        else:
            model, tokenizer = load_model(checkpoint.path)
        with engine_server(model, tokenizer, self.config.rollout.max_batch) as (url, _engine):
            yield url, tokenizer

    def rollout(self) -> EvalRollout:
        rollout = self.config.rollout
        return EvalRollout(rollout.knobs(), rollout.max_context_tokens, rollout.max_response_tokens)
