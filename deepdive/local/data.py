"""A run's data: the world, then train, held-out (and unseen-world) prompt rows through the real
converter, as slime would read them."""

from __future__ import annotations

import dataclasses
from typing import Any

from deepdive.convert.rows import convert
from deepdive.local.config import LocalRunConfig
from deepdive.offline.build import write_world
from deepdive.offline.world import WorldSizes, unseen_world_seed
from deepdive.protocol import SYSTEM_PROMPTS
from deepdive.run_paths import RunPaths
from services.base.errors import ConfigError


def prepare_data(config: LocalRunConfig, paths: RunPaths) -> dict[str, Any]:
    """The world, then train/eval prompt rows through the real converter (max_hops applied)."""
    world = config.world
    manifest = write_world(paths.world, world.seed, world)
    needed = {"train": "training question", "eval": "held-out question"}
    if config.warm_start.epochs:
        needed["demonstrations"] = "demonstration for the warm start"
    for key, what in needed.items():
        if not manifest[key]:
            raise ConfigError(
                f"this world has no {what}: a bigger world (world.people, world.artifacts, "
                "...) or a larger world.max_hops makes room for more"
            )
    system_prompt = SYSTEM_PROMPTS[config.rollout.system_prompt]
    for split in ("train", "eval"):
        convert(
            paths.world / f"qa_{split}.jsonl",
            paths.data / f"{split}.jsonl",
            source="world",
            strict=True,
            system_prompt=system_prompt,
        )
    if config.eval.unseen_questions:
        sizes = {item.name: getattr(world, item.name) for item in dataclasses.fields(WorldSizes)}
        unseen = WorldSizes(
            **{
                **sizes,
                "sft_questions": 0,
                "train_questions": 0,
                "eval_questions": config.eval.unseen_questions,
                "sft_worlds": 0,
            }
        )
        if not write_world(paths.unseen_world, unseen_world_seed(world.seed), unseen)["eval"]:
            raise ConfigError(
                "the unseen world has no question for eval.unseen_questions: a bigger world "
                "(world.people, world.artifacts, ...) makes room for some"
            )
        convert(
            paths.unseen_world / "qa_eval.jsonl",
            paths.data / "unseen.jsonl",
            source="world",
            strict=True,
            system_prompt=system_prompt,
        )
    return manifest
