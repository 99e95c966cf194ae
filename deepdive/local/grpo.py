"""The GRPO arithmetic, as slime computes it, for the local trainer.

- Advantages (slime's `_post_process_rewards` with `--advantage-estimator grpo`, rewards
  normalised by default: `--disable-rewards-normalization` turns that off): per prompt group,
  r - mean(r), divided by std(r) + 1e-6 (slime's default; `--disable-grpo-std-normalization`
  keeps r - mean(r)), where std is torch's unbiased one; mean and std over the episodes the
  engine answered, as the slime backend's --custom-reward-post-process-path does
  (deepdive.group_rewards). Every
  response token of a sample gets its sample's advantage (slime's `get_grpo_returns`).
- Policy loss (`compute_policy_loss`): ratio = exp(logp - logp_old); the PPO-clip objective
  max(-ratio * A, -clip(ratio, 1 - eps, 1 + eps_high) * A) on loss-mask-1 tokens.
- KL to a reference (`--use-kl-loss --kl-loss-type low_var_kl`): the k3 estimator
  exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10].
- Reduction: slime's default is the per-sample mean (each sample's masked token mean, averaged
  over samples); `--calculate-per-token-loss` is the token mean (every mask-1 token of the
  batch weighs the same). The per-sample mean weighs each token of a short trajectory more,
  so when short trajectories are failures (a malformed first call), it pushes down the very
  tokens successes share with them; the token mean does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deepdive.group_rewards import normalised_rewards
from deepdive.local.model import logits_to_keep


def group_advantages(
    rewards: Sequence[float],
    group_size: int,
    normalize_std: bool = True,
    answered: Sequence[bool] | None = None,
) -> list[float]:
    """One advantage per sample; samples of a group are contiguous, as slime orders them. The
    mean and std are over the `answered` samples (default all): an ABORTED episode's reward is
    no answer (deepdive.group_rewards, the arithmetic slime's hook uses)."""
    kept = [True] * len(rewards) if answered is None else list(answered)
    return normalised_rewards(rewards, kept, group_size, normalize_std and group_size > 1)


@dataclass(frozen=True)
class LossParts:
    loss: Any  # a scalar tensor with a graph
    policy_loss: float
    kl: float
    clip_fraction: float


def masked_sample_mean(values: Any, mask: Any) -> Any:
    """Mean over each row's mask-1 entries, then over rows (rows with an empty mask count as 0)."""
    per_row = (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    return per_row.mean()


def masked_token_mean(values: Any, mask: Any) -> Any:
    """Mean over every mask-1 entry of the batch."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def low_var_kl(logprobs: Any, ref_logprobs: Any) -> Any:
    import torch

    log_ratio = ref_logprobs - logprobs
    return torch.clamp(log_ratio.exp() - log_ratio - 1, min=-10, max=10)


def grpo_loss(
    logprobs: Any,
    old_logprobs: Any,
    advantages: Any,
    mask: Any,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    ref_logprobs: Any = None,
    kl_coef: float = 0.0,
    per_token: bool = False,
) -> LossParts:
    """PPO-clip loss over [rows, tokens] tensors; `advantages` is per row or per token.
    per_token: the token mean instead of the per-sample mean (see the module's docstring)."""
    import torch

    reduce = masked_token_mean if per_token else masked_sample_mean

    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logprobs)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - clip_low, 1 + clip_high) * advantages
    token_losses = torch.maximum(unclipped, clipped)
    policy = reduce(token_losses, mask)
    clip_fraction = reduce((clipped > unclipped).float(), mask)
    loss = policy
    kl_value = 0.0
    if ref_logprobs is not None:
        kl = reduce(low_var_kl(logprobs, ref_logprobs), mask)
        loss = loss + kl_coef * kl
        kl_value = float(kl.detach())
    return LossParts(loss, float(policy.detach()), kl_value, float(clip_fraction))


def scoring_temperature(sampling_temperature: float) -> float:
    """The temperature log-probs are taken at for tokens sampled at `sampling_temperature`:
    the same, except greedy decoding (0), which is scored at the plain softmax."""
    return sampling_temperature if sampling_temperature > 0 else 1.0


def token_logprobs(
    model: Any,
    sequences: Sequence[Sequence[int]],
    pad_id: int,
    temperature: float = 1.0,
    first: int = 0,
) -> Any:
    """log p(token_t | tokens_<t) for every token after the first, right-padded: [rows, max-1].

    `temperature` divides the logits first, as slime does with `--rollout-temperature` in its
    policy loss: the loss then scores the distribution the rollouts were sampled from. The
    engine samples from, and reports, the same log-softmax of the same weights, so for tokens
    it produced these equal its `output_token_logprobs` (tests/test_engine.py checks it).

    Only columns from `first` on are scored (the rest are 0): a caller that learns from the
    responses alone passes the shortest prompt's length - 1, so the vocabulary projection and
    its log-softmax skip the prompts (a fifth of a warm-start sequence), with the same values.
    """
    import torch

    width = max(len(s) for s in sequences)
    first = min(max(0, first), width - 1)
    device = next(model.parameters()).device
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long, device=device)
    attention = torch.zeros((len(sequences), width), dtype=torch.long, device=device)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(list(sequence), dtype=torch.long)
        attention[row, : len(sequence)] = 1
    keep = logits_to_keep(model, width - first)
    logits = model(input_ids=ids, attention_mask=attention, **keep).logits
    logits = logits[:, first - width : -1, :].float()  # a model without the keyword kept all
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    scored = logprobs.gather(-1, ids[:, first + 1 :, None]).squeeze(-1)
    return torch.nn.functional.pad(scored, (first, 0))
