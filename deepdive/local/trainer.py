"""Policy updates for the local backend: supervised steps on demonstrations and GRPO steps on
rollouts, both on the model's own tokens only (loss mask), with AdamW and gradient clipping.

Sequences are packed into micro-batches (sorted by length, so padding stays small) and their
gradients accumulated, each scaled by its share of the batch: the step is the same as one pass
over the whole batch with slime's per-sample-mean reduction.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from deepdive.local.grpo import grpo_loss, masked_sample_mean, token_logprobs


@dataclass
class Example:
    """One sequence to learn from: prompt + response tokens, the response's loss mask, and for
    GRPO its advantage and the old policy's log-probs of the response (None: the policy's own
    before this update, as slime recomputes them without --use-rollout-logprobs). A supervised
    example's mask may hold weights between 0 and 1 (the warm start's weighted observations)."""

    tokens: list[int]
    prompt_length: int
    loss_mask: Sequence[float]
    old_logprobs: list[float] | None = None
    advantage: float = 0.0

    def __post_init__(self) -> None:
        if len(self.tokens) - self.prompt_length != len(self.loss_mask):
            raise ValueError("loss_mask must cover exactly the response tokens")


@dataclass(frozen=True)
class OptimizerSettings:
    lr: float
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    micro_batch: int = 16


def response_tensor(
    examples: Sequence[Example], width: int, values: Any, device: Any = None
) -> Any:
    """Per-response-token values placed where `token_logprobs` scores those tokens: [rows, width-1].
    `values(example)` gives one number per response token."""
    import torch

    out = torch.zeros((len(examples), width - 1), dtype=torch.float)
    for row, example in enumerate(examples):
        start = example.prompt_length - 1
        row_values = values(example)
        out[row, start : start + len(row_values)] = torch.tensor(row_values, dtype=torch.float)
    return out.to(device) if device is not None else out


def _scored_from(chunk: Sequence[Example]) -> int:
    """The first column of `token_logprobs` any example's loss mask reaches."""
    return max(0, min(e.prompt_length for e in chunk) - 1)


def micro_batches(examples: Sequence[Example], size: int) -> Iterator[list[Example]]:
    ordered = sorted(examples, key=lambda e: len(e.tokens))
    for start in range(0, len(ordered), size):
        yield ordered[start : start + size]


def learned_from(examples: Sequence[Example], kl_coef: float) -> list[Example]:
    """The examples a GRPO step passes through the model: a zero-advantage sample adds exactly
    nothing to the loss or its gradient (without KL), but still counts in the per-sample mean."""
    return [e for e in examples if e.advantage != 0 or kl_coef > 0]


class PolicyTrainer:
    def __init__(
        self,
        model: Any,
        pad_id: int,
        settings: OptimizerSettings,
        reference: Any = None,
    ) -> None:
        import torch

        self.model = model
        self.pad_id = pad_id
        self.settings = settings
        self.reference = reference
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay
        )

    @staticmethod
    def frozen_copy(model: Any) -> Any:
        reference = copy.deepcopy(model)
        reference.eval()
        for parameter in reference.parameters():
            parameter.requires_grad_(False)
        return reference

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _step(self) -> float:
        import torch

        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    def sft_step(self, examples: Sequence[Example]) -> dict[str, float]:
        """One optimizer step of masked (weighted) negative log-likelihood over `examples`."""
        self.model.train()
        total = 0.0
        tokens = 0
        for chunk in micro_batches(examples, self.settings.micro_batch):
            width = max(len(e.tokens) for e in chunk)
            logprobs = token_logprobs(
                self.model, [e.tokens for e in chunk], self.pad_id, first=_scored_from(chunk)
            )
            mask = response_tensor(chunk, width, lambda e: e.loss_mask, logprobs.device)
            loss = -masked_sample_mean(logprobs, mask) * (len(chunk) / len(examples))
            loss.backward()
            total += float(loss.detach())
            tokens += int((mask > 0).sum())
        norm = self._step()
        self.model.eval()
        return {"loss": total, "grad_norm": norm, "tokens": tokens}

    def score(self, examples: Sequence[Example], temperature: float = 1.0) -> None:
        """Fill each example's missing `old_logprobs` with the policy's own, in the mode and
        micro batching `grpo_step` uses (for the same examples, the values its first pass
        computes): the old policy of updates that follow one another on one rollout batch."""
        import torch

        self.model.train()
        with torch.no_grad():
            for chunk in micro_batches(examples, self.settings.micro_batch):
                sequences = [e.tokens for e in chunk]
                scored = token_logprobs(
                    self.model, sequences, self.pad_id, temperature, _scored_from(chunk)
                )
                for row, example in enumerate(chunk):
                    if example.old_logprobs is None:
                        start = example.prompt_length - 1
                        end = start + len(example.loss_mask)
                        example.old_logprobs = scored[row, start:end].tolist()
        self.model.eval()

    def grpo_step(
        self,
        examples: Sequence[Example],
        clip_low: float,
        clip_high: float,
        kl_coef: float = 0.0,
        per_token: bool = False,
        temperature: float = 1.0,
    ) -> dict[str, float]:
        """One optimizer step of the PPO-clip loss (plus KL to the reference when kl_coef > 0)
        on log-probs at the rollout `temperature` (as slime scores them). Each pass is weighted
        by its share of the batch (of samples, or of tokens when per_token), so the accumulated
        gradient is the whole batch's. An example without `old_logprobs` is on-policy: its old
        log-probs are this pass's own, detached (this step's weights are the old policy)."""
        import torch

        sums = {"loss": 0.0, "policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        # skip the passes of the examples that add nothing (`learned_from`), keep their share
        active = learned_from(examples, kl_coef)
        if any(e.old_logprobs is None for e in active) and any(e.old_logprobs for e in active):
            self.score(active, temperature)  # a mixed batch: score the on-policy ones first
        total_tokens = sum(sum(e.loss_mask) for e in examples)
        self.model.train()
        for chunk in micro_batches(active, self.settings.micro_batch):
            width = max(len(e.tokens) for e in chunk)
            sequences = [e.tokens for e in chunk]
            first = _scored_from(chunk)
            logprobs = token_logprobs(self.model, sequences, self.pad_id, temperature, first)
            mask = response_tensor(chunk, width, lambda e: e.loss_mask, logprobs.device)
            if all(e.old_logprobs is None for e in chunk):
                old = logprobs.detach()
            else:
                old = response_tensor(chunk, width, lambda e: e.old_logprobs, logprobs.device)
            advantages = torch.tensor(
                [e.advantage for e in chunk], dtype=torch.float, device=logprobs.device
            )
            reference = None
            if kl_coef > 0 and self.reference is not None:
                with torch.no_grad():
                    reference = token_logprobs(
                        self.reference, sequences, self.pad_id, temperature, first
                    )
            parts = grpo_loss(
                logprobs, old, advantages, mask, clip_low, clip_high, reference, kl_coef, per_token
            )
            if per_token:
                share = sum(sum(e.loss_mask) for e in chunk) / max(1, total_tokens)
            else:
                share = len(chunk) / len(examples)
            (parts.loss * share).backward()
            sums["loss"] += float(parts.loss.detach()) * share
            sums["policy_loss"] += parts.policy_loss * share
            sums["kl"] += parts.kl * share
            sums["clip_fraction"] += parts.clip_fraction * share
        sums["grad_norm"] = self._step()
        self.model.eval()
        return sums

    def state_dict(self) -> dict[str, Any]:
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.reference is not None:
            state["reference"] = self.reference.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.reference is not None and "reference" in state:
            self.reference.load_state_dict(state["reference"])
