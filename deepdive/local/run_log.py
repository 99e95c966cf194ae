"""Per-step metrics of a local run: one JSON line per step (metrics.jsonl), the same scalars as
TensorBoard events (tensorboard/), and a PNG of the reward curve at the end.

A resumed run redoes the steps after its checkpoint, so their lines are dropped first: the file
always holds each step once, as the run that reached it computed it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from deepdive.run_paths import METRICS, TENSORBOARD
from services.base.files import atomic_path, atomic_write_bytes


class RunLog:
    def __init__(self, folder: Path, resume_after_step: int | None = None) -> None:
        self.folder = folder
        self.path = folder / METRICS
        folder.mkdir(parents=True, exist_ok=True)
        self._drop_after(resume_after_step)
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(str(folder / TENSORBOARD), flush_secs=10)

    def _drop_after(self, step: int | None) -> None:
        """Keep the complete lines of steps <= `step`; a run that starts over (None) keeps none."""
        if not self.path.exists():
            return
        if step is None:
            self.path.unlink()
            return
        kept = [
            line
            for line in self.path.read_bytes().splitlines()
            if line.strip() and _complete(line) and orjson.loads(line).get("step", 0) <= step
        ]
        atomic_write_bytes(self.path, b"".join(line + b"\n" for line in kept))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **metrics}
        with self.path.open("ab") as handle:
            handle.write(orjson.dumps(row) + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        for key, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._writer.add_scalar(key, value, step)

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [orjson.loads(line) for line in self.path.read_bytes().splitlines() if line.strip()]

    def close(self) -> None:
        self._writer.close()


def _complete(line: bytes) -> bool:
    try:
        return isinstance(orjson.loads(line), dict)
    except orjson.JSONDecodeError:  # a line cut by a kill
        return False


def plot_rewards(
    rows: list[dict[str, Any]], path: Path, evaluations: dict[str, float | None]
) -> Path:
    """Training reward per step (and its running mean), with the evaluations as lines
    (`evaluations`: label -> reward, in before/after pairs)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    steps = [row["step"] for row in rows]
    rewards = [row["reward_mean"] for row in rows]
    window = 5
    running = [
        sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
        for i in range(len(rewards))
    ]
    figure, axes = pyplot.subplots(figsize=(7, 4), dpi=100)
    axes.plot(steps, rewards, "o", alpha=0.35, label="training reward (step mean)")
    axes.plot(steps, running, "-", label=f"running mean ({window} steps)")
    # before / after pairs: dashed then dotted, a colour per question set
    for index, (name, value) in enumerate(evaluations.items()):
        if value is not None:
            style, colour = ("--", ":")[index % 2], ("grey", "tab:red")[index // 2 % 2]
            axes.axhline(value, linestyle=style, color=colour, label=f"{name}: {value:.3f}")
    axes.set_xlabel("GRPO step")
    axes.set_ylabel("reward")
    axes.set_ylim(-0.02, 1.02)
    axes.legend(loc="upper left", fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    with atomic_path(path) as partial:
        figure.savefig(partial)
    pyplot.close(figure)
    return path
