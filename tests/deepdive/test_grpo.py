"""GRPO arithmetic against hand-computed values, the loss mask, and the trainer's updates."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from deepdive.local.engine import GenerationRequest, LocalEngine  # noqa: E402
from deepdive.local.grpo import group_advantages, grpo_loss, low_var_kl, token_logprobs  # noqa: E402
from deepdive.local.model import new_model, train_tokenizer  # noqa: E402
from deepdive.local.trainer import Example, OptimizerSettings, PolicyTrainer  # noqa: E402


def test_group_advantages_by_hand() -> None:
    rewards = [1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1]
    advantages = group_advantages(rewards, 4)
    # group 1: mean 0.25, deviations (0.75, -0.25 x3), unbiased std sqrt(0.75 / 3) = 0.5
    assert advantages[:4] == pytest.approx([0.75 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 3)
    # group 2: mean 0.5, deviations +-0.5, unbiased std sqrt(1 / 3)
    std = math.sqrt(1 / 3)
    assert advantages[4:8] == pytest.approx([0.5 / (std + 1e-6)] * 2 + [-0.5 / (std + 1e-6)] * 2)
    # group 3: every sample alike, no signal (and no division by zero)
    assert advantages[8:] == [0.0] * 4
    assert group_advantages(rewards, 4, normalize_std=False)[:8] == pytest.approx(
        [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]
    )
    with pytest.raises(ValueError, match="groups of 5"):
        group_advantages(rewards, 5)


def test_policy_loss_by_hand() -> None:
    ratios = torch.tensor([[1.5, 0.7, 1.0], [0.5, 1.2, 1.0]])
    old = torch.full((2, 3), -1.0)
    logprobs = old + ratios.log()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    advantages = torch.tensor([1.0, -2.0])
    parts = grpo_loss(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.28)
    # row 0 (A = 1): max(-1.5, -1.28) = -1.28; max(-0.7, -0.8) = -0.7; the third token is masked
    # row 1 (A = -2): max(1.0, 1.6) = 1.6; max(2.4, 2.4) = 2.4; max(2.0, 2.0) = 2.0
    row0, row1 = (-1.28 - 0.7) / 2, (1.6 + 2.4 + 2.0) / 3
    assert float(parts.loss) == pytest.approx((row0 + row1) / 2, abs=1e-6)
    assert parts.policy_loss == pytest.approx((row0 + row1) / 2, abs=1e-6)
    assert parts.clip_fraction == pytest.approx((1 / 2 + 1 / 3) / 2, abs=1e-6)
    assert parts.kl == 0.0
    # slime's --calculate-per-token-loss: every unmasked token weighs the same
    tokens = grpo_loss(logprobs, old, advantages, mask, 0.2, 0.28, per_token=True)
    assert float(tokens.loss) == pytest.approx((-1.28 - 0.7 + 1.6 + 2.4 + 2.0) / 5, abs=1e-6)
    assert tokens.clip_fraction == pytest.approx(2 / 5, abs=1e-6)


def test_kl_to_the_reference_by_hand() -> None:
    logprobs = torch.tensor([[-1.0, -2.0]])
    reference = torch.tensor([[-0.9, -2.0]])
    assert float(low_var_kl(logprobs, reference)[0, 0]) == pytest.approx(
        math.exp(0.1) - 0.1 - 1, abs=1e-6
    )
    mask = torch.ones((1, 2))
    parts = grpo_loss(
        logprobs, logprobs, torch.tensor([0.0]), mask, ref_logprobs=reference, kl_coef=0.5
    )
    expected_kl = (math.exp(0.1) - 0.1 - 1) / 2
    assert parts.kl == pytest.approx(expected_kl, abs=1e-6)
    assert float(parts.loss) == pytest.approx(0.5 * expected_kl, abs=1e-6)


def test_masked_tokens_get_zero_gradient() -> None:
    logprobs = torch.tensor([[-1.0, -0.5, -2.0, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    parts = grpo_loss(
        logprobs,
        logprobs.detach() - 0.05,
        torch.tensor([1.0]),
        mask,
        ref_logprobs=logprobs.detach() + 0.3,
        kl_coef=0.1,
    )
    parts.loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad[0, 1] == 0 and logprobs.grad[0, 3] == 0
    assert logprobs.grad[0, 0] != 0 and logprobs.grad[0, 2] != 0


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    words = ["alpha beta gamma delta", "search click open finish", "the answer is here"]
    return train_tokenizer(words * 20, vocab_size=300)


def test_a_fully_masked_example_changes_no_weight(tokenizer: Any) -> None:
    model = new_model(tokenizer, hidden=32, layers=1, heads=2)
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, OptimizerSettings(lr=1e-2))
    for parameter in model.parameters():
        parameter.grad = None
    example = Example(list(range(5, 15)), 4, [0] * 6)
    trainer.model.train()
    logprobs = token_logprobs(model, [example.tokens], tokenizer.pad_token_id)
    from deepdive.local.trainer import response_tensor

    mask = response_tensor([example], len(example.tokens), lambda e: e.loss_mask)
    (logprobs * mask).sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_micro_batches_give_the_same_step_as_one_batch(tokenizer: Any) -> None:
    examples = [
        Example(list(range(5, 5 + n)), 3, [1, 0] * ((n - 3) // 2) + [1] * ((n - 3) % 2))
        for n in (8, 11, 14, 9)
    ]
    for example, advantage in zip(examples, (1.0, -0.5, 0.25, -0.75), strict=True):
        example.advantage = advantage
        example.old_logprobs = [-3.0] * len(example.loss_mask)
    for per_token in (False, True):
        results = []
        for micro in (1, 16):
            model = new_model(tokenizer, seed=4, hidden=32, layers=1, heads=2)
            trainer = PolicyTrainer(
                model, tokenizer.pad_token_id, OptimizerSettings(lr=1e-2, micro_batch=micro)
            )
            results.append(trainer.grpo_step(examples, 0.2, 0.28, per_token=per_token))
        # the accumulated gradient is the same (its norm is measured before the optimizer step)
        assert results[0]["grad_norm"] == pytest.approx(results[1]["grad_norm"], rel=1e-5)
        assert results[0]["loss"] == pytest.approx(results[1]["loss"], rel=1e-5)
        assert results[0]["grad_norm"] > 0


def test_overfit_one_prompt_raises_the_rewarded_completion(tokenizer: Any) -> None:
    """One prompt, 8 samples a step from the real engine, GRPO updates synced back into it.
    Reward 1 when the completion starts with a token from a fixed half of the vocabulary: the
    model's probability of that half starts near 0.5 and must rise clearly."""
    torch.manual_seed(0)
    model = new_model(tokenizer, seed=2, hidden=32, layers=1, heads=2)
    engine = LocalEngine(PolicyTrainer.frozen_copy(model), tokenizer)
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, OptimizerSettings(lr=3e-2))
    prompt = tokenizer.encode("the answer is", add_special_tokens=False)
    rewarded = torch.arange(len(tokenizer)) % 2 == 0

    def rewarded_probability() -> float:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]
        return float(torch.softmax(logits, -1)[rewarded].sum())

    before = rewarded_probability()
    for step in range(30):
        requests = [GenerationRequest(prompt, 3, seed=step * 8 + i) for i in range(8)]
        results = engine.generate_batch(requests)
        rewards = [float(rewarded[r.ids[0]]) for r in results]
        advantages = group_advantages(rewards, 8)
        examples = [
            Example(prompt + r.ids, len(prompt), [1] * len(r.ids), r.logprobs, a)
            for r, a in zip(results, advantages, strict=True)
        ]
        trainer.grpo_step(examples, 0.2, 0.28)
        engine.load_state_dict(model.state_dict())
    after = rewarded_probability()
    assert 0.3 < before < 0.7
    assert after > 0.9 and after > before + 0.3


def projected_widths(model: Any) -> list[int]:
    """The sequence length of every input the vocabulary projection sees, as it sees it."""
    widths: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: widths.append(args[0].shape[1]))
    return widths


def test_logprobs_from_a_column_equal_the_whole_sequences_there(tokenizer: Any) -> None:
    model = new_model(tokenizer, hidden=32, layers=1, heads=2)
    sequences = [list(range(5, 17)), list(range(9, 18))]
    whole = token_logprobs(model, sequences, tokenizer.pad_token_id, 0.7)
    widths = projected_widths(model)
    part = token_logprobs(model, sequences, tokenizer.pad_token_id, 0.7, first=4)
    assert widths == [12 - 4]  # the prompts' first 4 columns never reach the projection
    assert part.shape == whole.shape
    assert torch.equal(part[:, 4:], whole[:, 4:])
    assert not part[:, :4].any()


def test_the_trainer_projects_only_from_the_shortest_prompt_on(tokenizer: Any) -> None:
    model = new_model(tokenizer, hidden=32, layers=1, heads=2)
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, OptimizerSettings(lr=1e-2))
    examples = [
        Example(list(range(5, 17)), 6, [1.0] * 6),
        Example(list(range(5, 15)), 4, [1.0] * 6),
    ]
    widths = projected_widths(model)
    trainer.sft_step(examples)
    for example in examples:
        example.old_logprobs, example.advantage = [-2.0] * 6, 1.0
    trainer.grpo_step(examples, 0.2, 0.28)
    assert widths == [12 - 3, 12 - 3]  # from the shorter prompt's last token on


class WholeProjection:
    """A causal LM whose forward has no `logits_to_keep` (an older or custom model)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def forward(self, input_ids: Any, attention_mask: Any) -> Any:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    __call__ = forward

    def parameters(self) -> Any:
        return self.inner.parameters()


def test_a_model_without_logits_to_keep_is_scored_the_same(tokenizer: Any) -> None:
    model = new_model(tokenizer, hidden=32, layers=1, heads=2)
    sequences = [list(range(5, 17)), list(range(9, 18))]
    kept = token_logprobs(model, sequences, tokenizer.pad_token_id, 0.7, first=4)
    whole = token_logprobs(WholeProjection(model), sequences, tokenizer.pad_token_id, 0.7, first=4)
    assert torch.equal(kept, whole)


def grpo_samples(noise: float) -> list[Any]:
    """Two groups' samples whose engine-reported log-probs are off by `noise` (the last bits a
    row's batch companions change in the local engine)."""
    from deepdive.sample import LocalSample

    samples = []
    for n in (8, 11, 14, 9):
        mask = [1, 0] * ((n - 3) // 2) + [1] * ((n - 3) % 2)
        reported = [-2.0 + noise * i for i in range(len(mask))]
        samples.append(
            LocalSample(
                tokens=list(range(5, 5 + n)),
                response_length=len(mask),
                loss_mask=mask,
                rollout_log_probs=reported,
            )
        )
    return samples


def test_an_update_does_not_depend_on_the_engines_reported_logprobs(tokenizer: Any) -> None:
    """The old policy is the trainer's own, so a run whose engine batched a row differently
    still makes bit-equal updates. slime at 624b824 does the same unless
    --use-rollout-logprobs: slime/backends/megatron_utils/loss.py line 965 takes
    `batch.get("log_probs")` (the actor's), and actor.py lines 461-472 reuse the loss's own
    forward for them when one update uses the batch (`can_reuse_log_probs_in_loss`)."""
    from deepdive.local.episodes import examples_from

    weights = []
    for noise in (0.0, 1e-6):
        model = new_model(tokenizer, seed=4, hidden=32, layers=1, heads=2)
        trainer = PolicyTrainer(model, tokenizer.pad_token_id, OptimizerSettings(lr=1e-2))
        examples = examples_from(grpo_samples(noise), [1.0, -0.5, 0.25, -0.75])
        trainer.grpo_step(examples, 0.2, 0.28, per_token=True, temperature=0.7)
        weights.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


def test_scored_old_logprobs_give_the_on_policy_step(tokenizer: Any) -> None:
    """`score` (what updates after the first on one batch use as the old policy) fills in
    exactly the log-probs an on-policy step takes as its own."""
    from deepdive.local.episodes import examples_from

    weights, losses = [], []
    for scored in (False, True):
        model = new_model(tokenizer, seed=4, hidden=32, layers=1, heads=2)
        trainer = PolicyTrainer(
            model, tokenizer.pad_token_id, OptimizerSettings(lr=1e-2, micro_batch=2)
        )
        examples = examples_from(grpo_samples(0.0), [1.0, -0.5, 0.25, -0.75])
        if scored:
            trainer.score(examples, 0.7)
            assert all(len(e.old_logprobs or []) == len(e.loss_mask) for e in examples)
        losses.append(trainer.grpo_step(examples, 0.2, 0.28, temperature=0.7)["loss"])
        weights.append([p.detach().clone() for p in model.parameters()])
    assert losses[0] == losses[1]
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))
