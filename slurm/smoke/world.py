"""A small offline world for the steps that need services or prompts (3 and 5): its pages for
the tool server and its questions as slime prompt rows (`deepdive convert`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from deepdive.convert.rows import convert
from deepdive.offline.build import write_world
from deepdive.offline.world import WorldSizes
from slurm.config import ServiceTable

SIZES = WorldSizes(
    people=24,
    cities=8,
    guilds=6,
    artifacts=16,
    train_questions=64,
    eval_questions=4,
    sft_questions=4,
    max_hops=2,
)


@dataclass(frozen=True)
class SmokeWorld:
    folder: Path

    @property
    def corpus(self) -> Path:
        return self.folder / "corpus.jsonl"

    @property
    def prompts(self) -> Path:
        return self.folder / "prompts.jsonl"

    def tools_table(self) -> ServiceTable:
        """`[services.tools]`: the tool server over this world's pages (offline search)."""
        return {
            "search": "offline",
            "reader": "offline",
            "index_cache": False,
            "corpus": str(self.corpus),
        }


def write(folder: Path, seed: int = 1) -> SmokeWorld:
    world = SmokeWorld(folder)
    write_world(folder, seed, SIZES)
    convert(folder / "qa_train.jsonl", world.prompts, source="world")
    return world
