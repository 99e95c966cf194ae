"""The warm start's examples: the rollout's token layout, and weighted observations."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from deepdive.local.grpo import token_logprobs  # noqa: E402
from deepdive.local.model import new_model, train_tokenizer  # noqa: E402
from deepdive.local.trainer import OptimizerSettings, PolicyTrainer  # noqa: E402
from deepdive.local.warm_start import (  # noqa: E402
    DemonstrationExamples,
    copy_example,
    copy_warm_up,
    demonstration_example,
    read_demonstrations,
    renamed,
)
from deepdive.offline.build import write_world  # noqa: E402
from deepdive.offline.world import WorldSizes  # noqa: E402

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


@pytest.fixture(scope="module")
def demonstrations(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("world")
    sizes = WorldSizes(
        people=24, cities=8, guilds=6, artifacts=16, sft_questions=40, train_questions=10
    )
    write_world(out, seed=5, sizes=sizes)
    rows = read_demonstrations(out / "demonstrations.jsonl")
    assert len(rows) >= 30
    return rows


def _swap(row: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """Rename whole words by `mapping`, all at once (the test's own substitution)."""
    pattern = re.compile(r"(?<![A-Za-z])(" + "|".join(map(re.escape, mapping)) + r")(?![A-Za-z])")

    def swap(text: str) -> str:
        return pattern.sub(lambda match: mapping[match.group(1)], text)

    return {
        **row,
        "messages": [{**m, "content": swap(m["content"])} for m in row["messages"]],
        "segments": [{**s, "text": swap(s["text"])} for s in row["segments"]],
        "response": swap(row["response"]),
        "answer": swap(row["answer"]),
        "names": [mapping[n] for n in row["names"]],
    }


def test_renaming_is_consistent_and_keeps_the_answer_on_the_page(
    demonstrations: list[dict[str, Any]],
) -> None:
    pool = sorted({name for row in demonstrations for name in row["names"]})
    rng = random.Random(1)
    changed = 0
    for row in demonstrations:
        new = renamed(row, pool, rng)
        assert set(new["names"]) <= set(pool) and len(set(new["names"])) == len(row["names"])
        # the answer is still read off the last page, under its new name
        pages = [s["text"] for s in new["segments"] if s["role"] == "observation"]
        assert new["answer"] in pages[-1]
        assert new["segments"][-1]["text"].endswith(
            '"answer":"' + new["answer"] + '"}}</tool_call>'
        )
        assert new["response"] == "".join(s["text"] for s in new["segments"])
        # every occurrence was renamed: the inverse map gives back the original exactly
        back = dict(zip(new["names"], row["names"], strict=True))
        assert {k: v for k, v in _swap(new, back).items() if k != "names"} == {
            k: v for k, v in row.items() if k != "names"
        }
        changed += new["answer"] != row["answer"]
    assert changed > len(demonstrations) // 2


def test_examples_are_renamed_afresh_at_the_rate_asked(
    demonstrations: list[dict[str, Any]], tokenizer: Any
) -> None:
    plain = DemonstrationExamples(demonstrations, tokenizer, None, 0.3, rename=0.0)
    assert all(plain[i] is plain.plain[i] for i in range(len(plain)))
    always = DemonstrationExamples(demonstrations, tokenizer, None, 0.3, rename=1.0, seed=2)
    draws = [always[0].tokens for _ in range(5)]
    assert all(d != plain[0].tokens for d in draws) and len({tuple(d) for d in draws}) == 5
    again = DemonstrationExamples(demonstrations, tokenizer, None, 0.3, rename=1.0, seed=2)
    assert [again[0].tokens for _ in range(5)] == draws  # deterministic by seed
    half = DemonstrationExamples(demonstrations, tokenizer, None, 0.3, rename=0.5, seed=3)
    renamed_share = sum(half[1] is not half.plain[1] for _ in range(400)) / 400
    assert 0.4 < renamed_share < 0.6


@pytest.mark.slow
def test_the_copy_warm_up_teaches_a_fresh_model_to_copy(tokenizer: Any) -> None:
    """After it, the model repeats a random sequence it has never seen."""
    torch.manual_seed(0)
    model = new_model(tokenizer, seed=0, hidden=64, layers=2, heads=4)
    ids = [i for i in range(len(tokenizer)) if i not in set(tokenizer.all_special_ids)]
    probe = copy_example(random.Random(99), ids, 12)

    def repeat_accuracy() -> float:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([probe.tokens])).logits[0]
        predicted: list[int] = logits.argmax(-1)[probe.prompt_length - 1 : -1].tolist()
        return sum(p == t for p, t in zip(predicted, probe.tokens[12:], strict=True)) / 12

    assert repeat_accuracy() < 0.2
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, OptimizerSettings(lr=1e-2))
    history = copy_warm_up(trainer, ids, steps=160, length=12, batch_size=16, lr=1e-2, seed=0)
    assert history[-1]["loss"] < 0.2 * history[0]["loss"]
    model.eval()
    assert repeat_accuracy() >= 0.9


def test_a_name_is_the_same_tokens_on_the_page_in_the_thought_and_in_the_call(
    demonstrations: list[dict[str, Any]],
) -> None:
    """So reading the answer off the page is a token-for-token copy (deepdive.local.model)."""
    texts = [row["response"] for row in demonstrations]
    tokenizer = train_tokenizer(texts * 3, vocab_size=1024)
    for row in demonstrations:
        answer_ids = tokenizer.encode(row["answer"], add_special_tokens=False)
        final = row["segments"][-1]["text"]  # "The answer is X.\n<tool_call>...X...</tool_call>"
        page = [s["text"] for s in row["segments"] if s["role"] == "observation"][-1]
        for text in (final, page):
            ids = tokenizer.encode(text, add_special_tokens=False)
            runs = [ids[i : i + len(answer_ids)] for i in range(len(ids))]
            assert runs.count(answer_ids) == text.count(row["answer"]), (row["id"], text)
            assert tokenizer.decode(ids) == text  # byte-level: nothing lost
