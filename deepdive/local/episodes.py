"""Episodes through the real hooks: a batch of rollouts (`generate_with_tool`), their rewards
(`reward_func`), the step's metrics, and the trainer's examples made from them."""

from __future__ import annotations

import asyncio
import random
from argparse import Namespace
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

from deepdive.clients import close_clients
from deepdive.generate import generate_with_tool
from deepdive.local.config import LocalRunConfig
from deepdive.local.prompts import sample_from_row
from deepdive.local.trainer import Example
from deepdive.reward import reward_func
from deepdive.sample import status_name

# The services a batch is played against: this world's tool server and the reward server
# (training, held-out questions), or another world's tool server (deepdive.local.rollouts).
ServiceSet = Literal["world", "unseen"]
WORLD: ServiceSet = "world"
UNSEEN: ServiceSet = "unseen"


@dataclass(frozen=True)
class Evaluation:
    """Questions to score before and after GRPO, and the set of services that answers them."""

    name: str  # "held-out": this world's qa_eval; "unseen": another world's
    services: ServiceSet
    rows: list[dict[str, Any]]


def sampling_params(config: LocalRunConfig, temperature: float) -> dict[str, Any]:
    return {
        "max_new_tokens": config.rollout.max_response_tokens,
        "temperature": temperature,
        "top_p": config.rollout.top_p,
    }


def seed_for(*parts: object) -> int:
    return random.Random(":".join(str(p) for p in parts)).getrandbits(31)


async def rollout_batch(
    args: Namespace,
    rows: list[dict[str, Any]],
    group_size: int,
    params: dict[str, Any],
    seed: str,
    groups: list[int] | None = None,
) -> list[Any]:
    """Rollouts for each row x group_size, concurrently, then their rewards (batched per step).
    `groups` are the rows' group numbers in the whole batch (default 0, 1, ...): sample i of
    group g is index g * group_size + i, and its sampling seed follows from that index."""
    numbers = groups if groups is not None else list(range(len(rows)))
    samples = [
        sample_from_row(row, group_index=g, index=g * group_size + i)
        for g, row in zip(numbers, rows, strict=True)
        for i in range(group_size)
    ]
    runs = [
        generate_with_tool(args, sample, {**params, "sampling_seed": seed_for(seed, sample.index)})
        for sample in samples
    ]
    samples = list(await asyncio.gather(*runs))
    rewards = await reward_func(args, samples)
    assert isinstance(rewards, list)
    for sample, reward in zip(samples, rewards, strict=True):
        sample.reward = reward
    await close_clients()
    return samples


def rollout_metrics(samples: list[Any], group_size: int) -> dict[str, Any]:
    rewards = [float(s.reward) for s in samples]
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    stats = [s.metadata.get("deepdive", {}) for s in samples]
    calls: Counter[str] = Counter()
    for item in stats:
        calls.update(item.get("tool_calls", {}))
    statuses = Counter(status_name(s) for s in samples)
    count = len(samples)
    return {
        "reward_mean": sum(rewards) / count,
        "pass_at_n": sum(1 for g in groups if max(g) > 0) / len(groups),
        "solved_groups_all": sum(1 for g in groups if min(g) > 0) / len(groups),
        "turns_mean": sum(item.get("turns", 0) for item in stats) / count,
        "tool_calls_mean": sum(v for k, v in calls.items() if k != "malformed") / count,
        "malformed_mean": calls.get("malformed", 0) / count,
        "response_tokens_mean": sum(s.response_length for s in samples) / count,
        "model_tokens_mean": sum(sum(s.loss_mask or []) for s in samples) / count,
        **{f"status_{k.lower()}": v / count for k, v in sorted(statuses.items())},
    }


def examples_from(samples: list[Any], advantages: list[float]) -> list[Example]:
    return [
        Example(
            tokens=list(s.tokens),
            prompt_length=len(s.tokens) - s.response_length,
            loss_mask=list(s.loss_mask or []),
            # the trainer's own, not the engine's (`rollout_log_probs`): slime's default
            # (no --use-rollout-logprobs), and an update that the engine's batching cannot
            # change (its log-probs differ in the last bits with the batch a row decoded in)
            old_logprobs=None,
            advantage=advantage,
        )
        for s, advantage in zip(samples, advantages, strict=True)
        if s.response_length > 0
    ]
