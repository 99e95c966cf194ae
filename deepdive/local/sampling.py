"""One decode step's next tokens for every row of the engine's batch at once.

Each row samples from softmax(logits / its temperature), cut to its nucleus when top_p < 1
(greedy rows take the argmax), with one uniform number drawn from its own generator and the
inverse of its distribution's cumulative sum: the same distribution `torch.multinomial` samples
row by row, without its 2,048 exponential draws per token. Row by row it was a fifth of the
local engine's time (docs/benchmarks.md, "Local training").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def next_tokens(
    logprobs: Any,
    logits: Any,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    generators: Sequence[Any],
) -> list[int]:
    """The next token of each row. `logprobs` is log softmax(logits / T) for a sampled row
    (the distribution it reports), `logits` the raw scores greedy rows take the argmax of;
    `generators` holds each row's torch.Generator, or None for torch's default one."""
    import torch

    device = logits.device
    probs = logprobs.exp()
    nucleus = [row for row, top_p in enumerate(top_ps) if top_p < 1.0]
    if nucleus:
        picked = torch.tensor(nucleus, device=device)
        sorted_probs, order = torch.sort(probs[picked], dim=-1, descending=True)
        limits = torch.tensor([top_ps[row] for row in nucleus], device=device)[:, None]
        # the most likely tokens whose mass before them is under top_p (always the first)
        keep = sorted_probs.cumsum(-1) - sorted_probs < limits
        probs[picked] = torch.zeros_like(sorted_probs).scatter(1, order, sorted_probs * keep)
    uniforms = torch.cat(
        [torch.rand(1, generator=generator, device=device) for generator in generators]
    )
    sampled = inverse_cdf(probs, uniforms)
    greedy = torch.tensor([temperature <= 0 for temperature in temperatures], device=device)
    chosen = torch.where(greedy, logits.argmax(-1), sampled)
    return [int(token) for token in chosen.tolist()]


def inverse_cdf(probs: Any, uniforms: Any) -> Any:
    """Each row's token whose cumulative mass first exceeds its uniform number in [0, 1) times
    the row's mass (rows need not be normalised). Exceeds, not reaches: a token of probability
    0 (outside the nucleus) is never drawn, even at a uniform of exactly 0."""
    import torch

    cumulative = probs.cumsum(-1)
    targets = (uniforms * cumulative[:, -1])[:, None]
    sampled = torch.searchsorted(cumulative, targets, right=True)[:, 0]
    return sampled.clamp(max=probs.shape[-1] - 1)  # a rounding at the top end
