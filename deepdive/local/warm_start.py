"""The supervised warm start on demonstrations.jsonl (DeepDive also starts RL from an SFT model).

Each demonstration becomes the exact token sequence the rollout would build: the chat-templated
prompt, then each segment tokenised on its own (as the rollout tokenises each observation on
its own), with loss mask 1 on the model's segments and `observation_weight` on observations.

SFT of a pretrained model masks observations (weight 0). A policy trained from random weights
has no pretraining, and what it lacks is in-context copying: the answer off the page. Left to
the demonstrations alone it memorises the world's facts instead (it scores nothing on a world
it has not seen), so two things make it read (docs/local.md and docs/benchmarks.md have the figures):

- `copy_warm_up`: a few hundred steps of a synthetic copy task (a random token sequence, then
  the same again) grow the attention heads that copy earlier tokens (induction heads) before
  any demonstration is shown;
- `renamed`: each time a demonstration is shown, its entities get other names of the world,
  consistently across the question, the pages and the answer, so no name-to-fact pairing
  repeats and only reading the page predicts the answer.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from deepdive.local.trainer import Example, PolicyTrainer
from deepdive.protocol import SYSTEM_PROMPT


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


def renamed(row: dict[str, Any], pool: Sequence[str], rng: random.Random) -> dict[str, Any]:
    """The demonstration with each of its name words (`row["names"]`) replaced by a distinct
    word drawn from `pool`, everywhere: question, pages, calls and answer."""
    names = row.get("names") or []
    if not names:
        return row
    mapping = dict(zip(names, rng.sample(list(pool), len(names)), strict=True))
    pattern = re.compile(r"(?<![A-Za-z])(" + "|".join(map(re.escape, names)) + r")(?![A-Za-z])")

    def swap(text: str) -> str:
        return pattern.sub(lambda match: mapping[match.group(1)], text)

    return {
        **row,
        "messages": [{**m, "content": swap(m["content"])} for m in row["messages"]],
        "segments": [{**s, "text": swap(s["text"])} for s in row["segments"]],
        "response": swap(row["response"]),
        "answer": swap(row["answer"]),
        "names": [mapping[name] for name in names],
    }


class DemonstrationExamples(Sequence[Example]):
    """The warm start's examples: each demonstration tokenised once, or, with probability
    `rename`, renamed afresh every time it is drawn (deterministic by `seed`)."""

    def __init__(
        self,
        rows: list[dict[str, Any]],
        tokenizer: Any,
        system_prompt: str | None = None,
        observation_weight: float = 0.0,
        rename: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.rows = rows
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.observation_weight = observation_weight
        self.plain = [self.make(row) for row in rows]
        self.rename = rename
        self.pool = sorted({name for row in rows for name in row.get("names") or []})
        self.rng = random.Random(seed)

    def make(self, row: dict[str, Any]) -> Example:
        return demonstration_example(
            row, self.tokenizer, self.system_prompt, self.observation_weight
        )

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Example:  # type: ignore[override]
        if self.rename and self.rng.random() < self.rename:
            return self.make(renamed(self.rows[index], self.pool, self.rng))
        return self.plain[index]


def copy_example(rng: random.Random, token_ids: Sequence[int], length: int) -> Example:
    """A random token sequence, then the same again; loss on the repeat, which only copying
    predicts."""
    tokens = [rng.choice(token_ids) for _ in range(length)]
    return Example(tokens + tokens, length, [1.0] * length)


def _set_lr(trainer: PolicyTrainer, step: int, total: int, lr: float, warmup_steps: int) -> None:
    """Linear warm-up, then cosine decay to a tenth of `lr`."""
    if step < warmup_steps:
        trainer.set_lr(lr * (step + 1) / warmup_steps)
    else:
        progress = (step - warmup_steps) / max(1, total - warmup_steps)
        trainer.set_lr(lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))))


def copy_warm_up(
    trainer: PolicyTrainer,
    token_ids: Sequence[int],
    steps: int,
    length: int,
    batch_size: int,
    lr: float,
    seed: int,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """`steps` steps of `copy_example`s over `token_ids` (the tokenizer's ordinary tokens)."""
    rng = random.Random(seed)
    history = []
    for step in range(steps):
        _set_lr(trainer, step, steps, lr, min(10, steps))
        metrics = trainer.sft_step(
            [copy_example(rng, token_ids, length) for _ in range(batch_size)]
        )
        history.append(metrics)
        if on_step is not None:
            on_step(step + 1, steps, metrics)
    return history


def warm_start(
    trainer: PolicyTrainer,
    examples: Sequence[Example],
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
    order: list[int] = []
    history = []
    for step in range(total):
        batch: list[Example] = []
        while len(batch) < batch_size:
            if not order:
                order = list(range(len(examples)))
                rng.shuffle(order)
            batch.append(examples[order.pop()])
        _set_lr(trainer, step, total, lr, warmup_steps)
        metrics = trainer.sft_step(batch)
        history.append(metrics)
        if on_step is not None:
            on_step(step + 1, total, metrics)
    return history
