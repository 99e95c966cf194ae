"""The configuration of `deepdive run` (configs/local.toml), as typed dataclasses.

The defaults ARE the recipe: the measured one that configs/local.toml writes out key by key
(`make run` trains it in about 6 minutes on 2 CPU cores), so `deepdive run` without a file
trains the same thing as `deepdive run configs/local.toml`; tests/deepdive/test_local_config.py keeps
the two equal. Every table and key of a file is optional (an omitted one takes its default);
an unknown key, a wrong type or a missing model folder fails before anything starts, naming
the key and what it expects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar, Literal

from deepdive.offline.world import WorldSizes
from deepdive.rollout_settings import RolloutKnobs
from services.base.typed_config import load_toml, require


@dataclass(frozen=True)
class RunSection:
    """out: the run folder (world, checkpoints, metrics, plot, summary); resume: continue from
    its latest checkpoint when there is one."""

    out: str = "runs/local"
    seed: int = 0
    resume: bool = True
    threads: int = 0  # torch threads; 0 = all cores

    def __post_init__(self) -> None:
        require(bool(self.out), "run.out", "a folder", self.out)
        require(self.threads >= 0, "run.threads", "0 (all cores) or more", self.threads)


@dataclass(frozen=True)
class WorldSection(WorldSizes):
    """The world's sizes (deepdive.offline.world.WorldSizes: people, cities, guilds, artifacts,
    train_questions, eval_questions, max_hops, sft_questions, sft_worlds) and its seed.

    The sizes are redeclared with the recipe's values: WorldSizes' own defaults serve
    `deepdive world`, while a local run needs a world big enough that copying the answer off
    the page beats memorising it (about 1,000 distinct one-hop questions)."""

    people: int = 384
    cities: int = 24
    guilds: int = 16
    artifacts: int = 256
    train_questions: int = 250  # GRPO's prompts, never demonstrated (DeepDive's qa_rl)
    eval_questions: int = 60
    max_hops: int = 1  # a 0.6 M-parameter policy learns one hop in minutes
    sft_questions: int = 750  # demonstrated for the warm start (DeepDive's qa_sft)
    sft_worlds: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for item in fields(self):
            if item.name not in ("seed", "sft_worlds"):
                value = getattr(self, item.name)
                require(value >= 1, f"world.{item.name}", "at least 1", value)
        require(self.sft_worlds >= 0, "world.sft_worlds", "0 (this world) or more", self.sft_worlds)
        require(self.max_hops <= 3, "world.max_hops", "1, 2 or 3", self.max_hops)


@dataclass(frozen=True)
class ModelSection:
    """path: a local Hugging Face causal-LM folder; empty = a tiny Qwen2 with a tokenizer
    trained on the world's text."""

    path: str = ""
    vocab_size: int = 2048
    hidden: int = 128
    layers: int = 2
    heads: int = 4

    def __post_init__(self) -> None:
        if self.path:
            require(
                (Path(self.path) / "config.json").is_file(),
                "model.path",
                "a Hugging Face model folder with config.json",
                self.path,
            )
        for name in ("vocab_size", "hidden", "layers", "heads"):
            value = getattr(self, name)
            require(value >= 1, f"model.{name}", "at least 1", value)
        require(
            self.hidden % self.heads == 0, "model.hidden", "a multiple of model.heads", self.hidden
        )


@dataclass(frozen=True)
class RolloutSection(RolloutKnobs):
    """The rollout's knobs (deepdive.rollout_settings.RolloutKnobs: the keys and defaults of
    every backend, `[slime.deepdive]` too), then what only the local run has: the response
    budget, the context, sampling, the engine's batch and the system prompt."""

    KEYS: ClassVar[str] = "rollout."

    max_response_tokens: int = 512  # a one-hop demonstration takes 280-370
    max_context_tokens: int = 2048
    temperature: float = 0.7
    top_p: float = 1.0
    max_batch: int = 64  # requests the engine decodes together
    system_prompt: Literal["full", "compact"] = "compact"

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_response_tokens", "max_context_tokens", "max_batch"):
            value = getattr(self, name)
            require(value >= 1, f"rollout.{name}", "at least 1", value)
        require(self.temperature >= 0, "rollout.temperature", ">= 0", self.temperature)
        require(0 < self.top_p <= 1, "rollout.top_p", "in (0, 1]", self.top_p)


@dataclass(frozen=True)
class WarmStartSection:
    """Supervised steps on demonstrations.jsonl: loss on the model's segments, and on the
    observations weighted by `observation_weight`; `rename` of the demonstrations shown with
    other names; first, `copy_steps` steps of a synthetic copy task (see deepdive.local.warm_start
    for why: a policy from random weights memorises facts instead of reading pages)."""

    epochs: float = 7.0
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 10
    observation_weight: float = 0.3
    rename: float = 1.0  # the fraction of demonstrations shown with other names
    copy_steps: int = 200  # 0 = no copy warm-up
    copy_length: int = 48  # tokens, then the same again
    copy_batch: int = 32
    copy_lr: float = 3e-3

    def __post_init__(self) -> None:
        require(self.epochs >= 0, "warm_start.epochs", ">= 0", self.epochs)
        require(self.batch_size >= 1, "warm_start.batch_size", "at least 1", self.batch_size)
        require(self.lr > 0, "warm_start.lr", "a positive number", self.lr)
        require(self.warmup_steps >= 0, "warm_start.warmup_steps", ">= 0", self.warmup_steps)
        require(
            0 <= self.observation_weight <= 1,
            "warm_start.observation_weight",
            "in [0, 1]",
            self.observation_weight,
        )
        require(0 <= self.rename <= 1, "warm_start.rename", "in [0, 1]", self.rename)
        require(self.copy_steps >= 0, "warm_start.copy_steps", "0 (off) or more", self.copy_steps)
        require(self.copy_length >= 2, "warm_start.copy_length", "at least 2", self.copy_length)
        require(self.copy_batch >= 1, "warm_start.copy_batch", "at least 1", self.copy_batch)
        require(self.copy_lr > 0, "warm_start.copy_lr", "a positive number", self.copy_lr)


@dataclass(frozen=True)
class GRPOSection:
    steps: int = 36
    prompts_per_step: int = 16
    samples_per_prompt: int = 8
    lr: float = 5e-5  # 3e-4 collapses the reading policy in 4 steps
    normalize_std: bool = True  # false = slime's --disable-grpo-std-normalization
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0  # > 0 keeps a frozen reference (the warm-started policy)
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    per_token_loss: bool = True  # slime's --calculate-per-token-loss (token mean)
    updates_per_step: int = 1  # optimizer steps per rollout batch (minibatches)
    micro_batch: int = 16  # sequences per forward/backward pass

    def __post_init__(self) -> None:
        for name in ("prompts_per_step", "samples_per_prompt", "updates_per_step", "micro_batch"):
            value = getattr(self, name)
            require(value >= 1, f"grpo.{name}", "at least 1", value)
        require(self.steps >= 0, "grpo.steps", ">= 0", self.steps)
        for name in ("lr", "max_grad_norm"):
            require(
                getattr(self, name) > 0, f"grpo.{name}", "a positive number", getattr(self, name)
            )
        for name in ("clip_low", "clip_high", "kl_coef", "weight_decay"):
            require(getattr(self, name) >= 0, f"grpo.{name}", ">= 0", getattr(self, name))
        total = self.prompts_per_step * self.samples_per_prompt
        require(
            total % self.updates_per_step == 0,
            "grpo.updates_per_step",
            f"a divisor of prompts_per_step x samples_per_prompt ({total})",
            self.updates_per_step,
        )


@dataclass(frozen=True)
class CheckpointSection:
    every: int = 5  # steps; the last step always writes one
    keep: int = 2  # newest checkpoints kept (older ones are deleted after a new one lands)

    def __post_init__(self) -> None:
        require(self.every >= 1, "checkpoint.every", "at least 1", self.every)
        require(self.keep >= 1, "checkpoint.keep", "at least 1", self.keep)


@dataclass(frozen=True)
class EvalSection:
    """Held-out reward before and after GRPO: every eval question (or the first `questions`),
    `samples` rollouts each, greedy unless temperature > 0. `unseen_questions` > 0 also asks
    that many questions of a world the policy never saw, on its own tool server: a policy that
    reads the pages scores there too, one that recalls this world's facts scores nothing."""

    questions: int = 0  # 0 = all
    temperature: float = 0.7  # the training temperature
    samples: int = 8  # per question (with temperature > 0, the mean of several is steadier)
    before: bool = True
    unseen_questions: int = 0  # 0 = off

    def __post_init__(self) -> None:
        require(self.questions >= 0, "eval.questions", ">= 0", self.questions)
        require(
            self.unseen_questions >= 0,
            "eval.unseen_questions",
            "0 (off) or more",
            self.unseen_questions,
        )
        require(self.samples >= 1, "eval.samples", "at least 1", self.samples)
        require(self.temperature >= 0, "eval.temperature", ">= 0", self.temperature)


@dataclass(frozen=True)
class LocalRunConfig:
    run: RunSection = field(default_factory=RunSection)
    world: WorldSection = field(default_factory=WorldSection)
    model: ModelSection = field(default_factory=ModelSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    warm_start: WarmStartSection = field(default_factory=WarmStartSection)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    eval: EvalSection = field(default_factory=EvalSection)


def load_local_config(path: Path | None, overrides: Sequence[str] = ()) -> LocalRunConfig:
    return load_toml(path, LocalRunConfig, overrides)
