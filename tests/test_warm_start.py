"""The warm start's examples: the rollout's token layout, and weighted observations."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from deepdive.grpo import token_logprobs  # noqa: E402
from deepdive.local_model import new_model, train_tokenizer  # noqa: E402
from deepdive.trainer import OptimizerSettings, PolicyTrainer  # noqa: E402
from deepdive.warm_start import demonstration_example  # noqa: E402

ROW: dict[str, Any] = {
    "id": "q1",
    "messages": [
        {"role": "system", "content": "the demonstration's own prompt"},
        {"role": "user", "content": "Which guild was the shipwright born in 1761 a member of?"},
    ],
    "segments": [
        {"role": "model", "text": "search the shipwright born in 1761"},
        {"role": "observation", "text": "Dubous Kitrous was a shipwright born in 1761."},
        {"role": "model", "text": "finish Bovre Guild"},
    ],
}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    texts = [m["content"] for m in ROW["messages"]] + [s["text"] for s in ROW["segments"]]
    return train_tokenizer(texts * 20, vocab_size=300)


def test_observations_carry_their_weight_and_model_segments_one(tokenizer: Any) -> None:
    observation = len(tokenizer.encode(ROW["segments"][1]["text"], add_special_tokens=False))
    for weight in (0.0, 0.25):
        example = demonstration_example(ROW, tokenizer, "a compact prompt", weight)
        response = len(example.tokens) - example.prompt_length
        assert len(example.loss_mask) == response
        assert list(example.loss_mask).count(weight) == observation
        assert list(example.loss_mask).count(1.0) == response - observation
        # the observation sits between the two model segments, as the rollout appends it
        first = len(tokenizer.encode(ROW["segments"][0]["text"], add_special_tokens=False))
        assert list(example.loss_mask[first : first + observation]) == [weight] * observation
    prompt = tokenizer.decode(example.tokens[: example.prompt_length])
    assert "a compact prompt" in prompt and "own prompt" not in prompt


def test_the_supervised_loss_is_the_weighted_mean_of_the_response(tokenizer: Any) -> None:
    example = demonstration_example(ROW, tokenizer, None, 0.25)
    model = new_model(tokenizer, seed=3, hidden=32, layers=1, heads=2)
    with torch.no_grad():
        logprobs = token_logprobs(model, [example.tokens], tokenizer.pad_token_id)[0]
    response = logprobs[example.prompt_length - 1 :]
    weights = torch.tensor(list(example.loss_mask))
    expected = -float((response * weights).sum() / weights.sum())
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, OptimizerSettings(lr=1e-3))
    metrics = trainer.sft_step([example])
    assert metrics["loss"] == pytest.approx(expected, rel=1e-5)
    # a weighted observation changes the loss: it is not masked out
    masked = demonstration_example(ROW, tokenizer, None, 0.0)
    unweighted = torch.tensor(list(masked.loss_mask))
    assert -float((response * unweighted).sum() / unweighted.sum()) != pytest.approx(expected)
    assert metrics["tokens"] == len(example.loss_mask)
