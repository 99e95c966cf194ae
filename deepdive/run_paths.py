"""What every run keeps in its folder RUN/, local or on a cluster: one description of the
layout, which a cluster run's RunFolder (slurm/run_folder.py) extends with its own notes.

    RUN/world/, unseen_world/     the offline world trained and evaluated on (local backend)
    RUN/data/                     the prompts, as the trainer reads them
    RUN/base_model/               the small model the local backend builds to start from
    RUN/checkpoints/              the trainer's checkpoints (step-NNNNNN/)
    RUN/final_model/              the trained model, a Hugging Face folder
    RUN/logs/metrics.jsonl        one line of metrics per step (deepdive/local/run_log.py)
    RUN/logs/tensorboard/         the same scalars as TensorBoard events
    RUN/trajectories/             each step's recorded episodes and agent statistics
                                  (docs/trajectories.md)
    RUN/reward_curve.png          the reward curve, drawn at the end
    RUN/summary.json              what the run did, written at the end

Its own module, importing nothing but the standard library: every node's launcher reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# inside RUN/logs/ (what RunLog writes there)
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"
# inside RUN/, and what `deepdive trajectories` looks for in any folder it is given
TRAJECTORIES = "trajectories"


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def world(self) -> Path:
        return self.root / "world"

    @property
    def unseen_world(self) -> Path:
        return self.root / "unseen_world"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def base_model(self) -> Path:
        return self.root / "base_model"

    @property
    def final_model(self) -> Path:
        return self.root / "final_model"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def metrics(self) -> Path:
        return self.logs / METRICS

    @property
    def tensorboard(self) -> Path:
        """The trainer's TensorBoard events (what `deepdive status` reads)."""
        return self.logs / TENSORBOARD

    @property
    def trajectories(self) -> Path:
        """Each step's recorded episodes (deepdive.trajectory_recorder)."""
        return self.root / TRAJECTORIES

    @property
    def plot(self) -> Path:
        return self.root / "reward_curve.png"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"
