"""Prompt rows (as `deepdive convert` writes them) for the local trainer: reading them, drawing
them in seeded epochs with a position a checkpoint can store, and turning them into samples."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from deepdive.convert.rows import INPUT_KEY, LABEL_KEY, METADATA_KEY
from deepdive.sample import Sample


def read_prompt_rows(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def sample_from_row(row: dict[str, Any], group_index: int = 0, index: int = 0) -> Any:
    """A fresh sample for one prompt row, as slime's data source would build it."""
    return Sample(
        group_index=group_index,
        index=index,
        prompt=list(row[INPUT_KEY]),
        label=row[LABEL_KEY],
        metadata=dict(row.get(METADATA_KEY) or {}),
    )


@dataclass
class PromptSampler:
    """Every row once per epoch, in an order fixed by (seed, epoch)."""

    size: int
    seed: int
    epoch: int = 0
    cursor: int = 0

    def _order(self) -> list[int]:
        order = list(range(self.size))
        random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        return order

    def take(self, count: int) -> list[int]:
        taken: list[int] = []
        order = self._order()
        while len(taken) < count:
            if self.cursor == self.size:
                self.epoch, self.cursor = self.epoch + 1, 0
                order = self._order()
            taken.append(order[self.cursor])
            self.cursor += 1
        return taken

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
