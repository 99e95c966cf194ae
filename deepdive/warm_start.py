"""The supervised warm start on demonstrations.jsonl (DeepDive also starts RL from an SFT model).

Each demonstration becomes the exact token sequence the rollout would build: the chat-templated
prompt, then each segment tokenised on its own (as the rollout tokenises each observation on
its own), with loss mask 1 on the model's segments and `observation_weight` on observations.

SFT of a pretrained model masks observations (weight 0). A policy trained from random weights
has no pretraining, and what it lacks is in-context copying (the question's words into the
query, the answer off the page): predicting the world's pages, which repeat every name in
title, URL and text, teaches that copying, and the policy then generalises to held-out
questions instead of memorising the training ones (README "Local training" has the figures).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from deepdive.protocol import SYSTEM_PROMPT
from deepdive.trainer import Example, PolicyTrainer


def read_demonstrations(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def tokenizer_texts(
    corpus: Path, demonstrations: list[dict[str, Any]], system_prompt: str = SYSTEM_PROMPT
) -> Iterable[str]:
    """What the world's tokenizer learns from: the pages, the questions, the demonstrations and
    the system prompt, each about as often as training will show it."""
    for line in corpus.read_bytes().splitlines():
        if line.strip():
            yield orjson.loads(line)["text"]
    for row in demonstrations:
        yield system_prompt
        yield row["messages"][-1]["content"]
        yield row["response"]


def demonstration_example(
    row: dict[str, Any],
    tokenizer: Any,
    system_prompt: str | None = None,
    observation_weight: float = 0.0,
) -> Example:
    """`system_prompt` replaces the demonstration's own, so the warm start sees the prompt the
    rollouts will see."""
    messages = [
        {**m, "content": system_prompt} if m["role"] == "system" and system_prompt else m
        for m in row["messages"]
    ]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = list(tokenizer.encode(prompt, add_special_tokens=False))
    ids: list[int] = []
    mask: list[float] = []
    for segment in row["segments"]:
        piece = list(tokenizer.encode(segment["text"], add_special_tokens=False))
        ids += piece
        weight = 1.0 if segment["role"] == "model" else observation_weight
        mask += [weight] * len(piece)
    return Example(prompt_ids + ids, len(prompt_ids), mask)


def warm_start(
    trainer: PolicyTrainer,
    examples: list[Example],
    epochs: float,
    batch_size: int,
    lr: float,
    warmup_steps: int,
    seed: int,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """ceil(epochs x examples / batch_size) steps over shuffled examples; linear warm-up, then
    cosine decay to a tenth of `lr`. Returns each step's metrics."""
    total = math.ceil(epochs * len(examples) / batch_size) if examples else 0
    rng = random.Random(seed)
    order: list[Example] = []
    history = []
    for step in range(total):
        batch: list[Example] = []
        while len(batch) < batch_size:
            if not order:
                order = list(examples)
                rng.shuffle(order)
            batch.append(order.pop())
        if step < warmup_steps:
            trainer.set_lr(lr * (step + 1) / warmup_steps)
        else:
            progress = (step - warmup_steps) / max(1, total - warmup_steps)
            trainer.set_lr(lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))))
        metrics = trainer.sft_step(batch)
        history.append(metrics)
        if on_step is not None:
            on_step(step + 1, total, metrics)
    return history
