"""slime's group normalisation of rewards, over the episodes SGLang answered:
`--custom-reward-post-process-path deepdive.group_rewards.post_process_rewards`.

slime normalises each prompt's group of rewards before it trains on them
(slime/ray/rollout.py, `_post_process_rewards`, lines 608-633 at 624b824): with
`--advantage-estimator` grpo, gspo, cispo or reinforce_plus_plus_baseline and rewards
normalisation on (`--disable-rewards-normalization` turns it off), r - mean(r) over the group,
then, for grpo, gspo and cispo unless `--disable-grpo-std-normalization`, divided by
std(r) + 1e-6 (torch's unbiased std). Groups are `--n-samples-per-prompt` consecutive
samples when the rollout has n x `--rollout-batch-size` of them, else the whole rollout is one
group (slime's "samples count are not equal in each group").

An ABORTED episode (SGLang refused or failed it: deepdive.aborts) is no answer, yet its
reward 0 entered its group's mean and std there: in the group [1, aborted, 0, 1] the others
got [0.866, -0.866, 0.866] instead of [0.577, -1.155, 0.577], so one refusal made a wrong
answer look less wrong and a right one less right. This is slime's arithmetic, exactly (the
same torch operations, so a rollout without aborts gets slime's numbers bit for bit), with
each group's mean and std over the episodes SGLang answered; an aborted episode's normalised
reward is 0 (it trains no token either way), and a group with one answer left has nothing to
compare it with: 0. The local trainer uses the same function (deepdive.local.grpo).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from deepdive.sample import status_name

STD_EPSILON = 1e-6  # slime's: rewards / (std + 1e-6)
CENTRED = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")  # r - mean(r)
SCALED = ("grpo", "gspo", "cispo")  # ... / (std(r) + 1e-6)


def normalised_rewards(
    rewards: Sequence[float],
    answered: Sequence[bool],
    group_size: int,
    scale: bool = True,
) -> list[float]:
    """Per group of `group_size` consecutive rewards: r - mean, divided by std + 1e-6 when
    `scale`, the mean and std over the answered ones (torch float32, as slime computes it);
    0 for an unanswered one and for the only answer of its group."""
    import torch

    if group_size < 1 or len(rewards) % group_size or len(answered) != len(rewards):
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    grouped = torch.tensor(list(rewards), dtype=torch.float).view(-1, group_size)
    centred = grouped - grouped.mean(dim=-1, keepdim=True)  # slime's, lines 620-626
    if scale:
        centred = centred / (centred.std(dim=-1, keepdim=True) + STD_EPSILON)
    kept = torch.tensor(list(answered), dtype=torch.bool).view(-1, group_size)
    for row in range(grouped.shape[0]):
        if bool(kept[row].all()):
            continue  # slime's numbers, bit for bit
        values = grouped[row][kept[row]]
        centred[row] = 0.0
        if values.numel() < 2:
            continue
        own = values - values.mean(dim=-1, keepdim=True)
        if scale:
            own = own / (own.std(dim=-1, keepdim=True) + STD_EPSILON)
        centred[row][kept[row]] = own
    return [float(value) for value in centred.flatten()]


def reward_value(args: Any, sample: Any) -> float:
    """slime's `Sample.get_reward_value` (slime/utils/types.py, lines 246-247): the reward, or
    its `--reward-key` entry."""
    key = getattr(args, "reward_key", None)
    return float(sample.reward[key] if key else sample.reward)


def post_process_rewards(args: Any, samples: list[Any]) -> tuple[list[float], list[float]]:
    """slime's `_post_process_rewards` (slime calls it with the rollout's flat samples:
    slime/ray/rollout.py, lines 609-610 and 642), over the answered episodes: the raw rewards
    and the ones it trains on."""
    raw = [reward_value(args, sample) for sample in samples]
    if not raw:
        return [], []
    estimator = getattr(args, "advantage_estimator", "grpo")
    if estimator not in CENTRED or not getattr(args, "rewards_normalization", True):
        return raw, raw
    group_size = int(getattr(args, "n_samples_per_prompt", 1) or 1)
    batch = int(getattr(args, "rollout_batch_size", 0) or 0)
    if len(raw) != group_size * batch:
        group_size = len(raw)  # uneven groups: the whole rollout is one (slime's line 624)
    scale = estimator in SCALED and bool(getattr(args, "grpo_std_normalization", True))
    answered = [status_name(sample) != "ABORTED" for sample in samples]
    return raw, normalised_rewards(raw, answered, group_size, scale)
