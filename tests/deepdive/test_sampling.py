"""The engine's batched sampler: each row drawn from its own distribution (temperature, nucleus,
greedy), from its own generator, in one pass over the batch."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from deepdive.local.sampling import inverse_cdf, next_tokens  # noqa: E402

DRAWS = 40_000


def draw(logits: list[float], temperature: float, top_p: float, draws: int = DRAWS) -> list[int]:
    """`draws` rows of the same logits in one batch, sharing one seeded generator."""
    batch = torch.tensor([logits] * draws)
    logprobs = torch.log_softmax(batch / (temperature if temperature > 0 else 1.0), -1)
    generator = torch.Generator().manual_seed(7)
    return next_tokens(logprobs, batch, [temperature] * draws, [top_p] * draws, [generator] * draws)


def frequencies(tokens: list[int], vocabulary: int) -> list[float]:
    return [tokens.count(token) / len(tokens) for token in range(vocabulary)]


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_each_row_is_drawn_from_its_tempered_distribution(temperature: float) -> None:
    logits = [2.0, 1.0, 0.0, -1.0, 0.5]
    expected = torch.softmax(torch.tensor(logits) / temperature, -1).tolist()
    seen = frequencies(draw(logits, temperature, 1.0), len(logits))
    for p, q in zip(expected, seen, strict=True):
        # 5 binomial standard errors at 40,000 draws
        assert abs(p - q) < 5 * (p * (1 - p) / DRAWS) ** 0.5 + 1e-9, (expected, seen)


def test_the_nucleus_keeps_the_likeliest_tokens_renormalised() -> None:
    """top_p 0.8 over (0.5, 0.25, 0.15, 0.1): a token is kept while the mass before it is under
    0.8 (SGLang's rule), so the first three are, renormalised, and the fourth is never drawn."""
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    seen = frequencies(draw(probs.log().tolist(), 1.0, 0.8), 4)
    assert seen[3] == 0.0
    kept = (probs[:3] / probs[:3].sum()).tolist()
    for p, q in zip(kept, seen[:3], strict=True):
        assert abs(p - q) < 5 * (p * (1 - p) / DRAWS) ** 0.5, (kept, seen)


def test_a_token_of_probability_zero_is_never_drawn() -> None:
    """Masked tokens (log-prob -inf) at both ends of the vocabulary and between."""
    inf = float("-inf")
    tokens = draw([inf, 0.0, inf, 0.0, inf], 1.0, 1.0)
    assert set(tokens) == {1, 3}


def test_the_inverse_cdf_skips_tokens_of_probability_zero_at_either_end() -> None:
    """At a uniform of exactly 0 the first token of mass, not a masked one before it; at the
    top end the last token of mass, not one past the vocabulary."""
    probs = torch.tensor([[0.0, 0.0, 0.3, 0.0, 0.7, 0.0]] * 3)
    uniforms = torch.tensor([0.0, 0.5, 1.0 - 2**-24])
    assert inverse_cdf(probs, uniforms).tolist() == [2, 4, 4]


def test_greedy_rows_take_the_argmax_beside_sampled_rows() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    logprobs = torch.log_softmax(logits, -1)
    greedy = [
        next_tokens(
            logprobs, logits, [0.0, 1.0], [1.0, 1.0], [torch.Generator().manual_seed(s)] * 2
        )[0]
        for s in range(50)
    ]
    assert set(greedy) == {1}


def test_rows_draw_from_their_own_generators() -> None:
    """A row's tokens depend on its seed alone, not on the rows beside it."""
    logits = torch.zeros((3, 50))
    logprobs = torch.log_softmax(logits, -1)

    def tokens(seeds: list[int]) -> list[int]:
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        return next_tokens(
            logprobs[: len(seeds)],
            logits[: len(seeds)],
            [1.0] * len(seeds),
            [1.0] * len(seeds),
            generators,
        )

    alone = tokens([11])[0]
    assert tokens([3, 11, 5])[1] == alone == tokens([11, 4])[0]
    assert len({tuple(tokens([s, s + 1, s + 2])) for s in range(20)}) > 1
