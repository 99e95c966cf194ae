"""The engine's two decoders give the same tokens, and a row started from a finished row's cache
the same as one computed from scratch; the prefix store finds, confirms and forgets entries."""

from __future__ import annotations

import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from deepdive.local.decoder import (  # noqa: E402
    DirectDecoder,
    TransformersDecoder,
    supports_direct,
)
from deepdive.local.engine import GenerationRequest, LocalEngine  # noqa: E402
from deepdive.local.prefix_store import PrefixStore  # noqa: E402


class Tokenizer:
    """What the engine reads of a tokenizer, over a vocabulary of bare ids."""

    pad_token_id = 0
    eos_token_id = 1

    def __len__(self) -> int:
        return 300

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


def qwen2(kv_heads: int = 4) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )
    model: Any = Qwen2ForCausalLM(config)
    return model.eval()


def llama() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=512,
    )
    model: Any = LlamaForCausalLM(config)
    return model.eval()


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 300) for _ in range(rng.randrange(3, 40))] for _ in range(count)]


def greedy(decoder: Any, steps: int, leave: dict[int, list[int]]) -> list[Any]:
    """Each step's scores of every row still decoding; at step s only rows `leave[s]` stay."""
    seen = [decoder.logits.clone()]
    for step in range(steps):
        if step in leave:
            decoder.keep(leave[step])
        decoder.step(decoder.logits.argmax(-1).tolist())
        seen.append(decoder.logits.clone())
    return seen


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_the_direct_decoder_scores_as_transformers_does(kv_heads: int) -> None:
    """Left padding, rows leaving, grouped key-value heads: the same scores every step."""
    model = qwen2(kv_heads)
    assert supports_direct(model)
    batch = prompts(5)
    leave = {3: [0, 2, 3, 4], 6: [1, 3]}
    with torch.no_grad():
        direct = greedy(DirectDecoder(model, batch, [None] * 5, 12, 0), 10, leave)
        generic = greedy(TransformersDecoder(model, batch, 0), 10, leave)
    for a, b in zip(direct, generic, strict=True):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


def test_a_row_started_from_a_finished_rows_cache_scores_as_from_scratch() -> None:
    """Turn two of an episode (turn one, its tokens, an observation) beside a fresh prompt:
    the cached row prefills only what follows its cache, and every score is the same."""
    model = qwen2()
    first, fresh = prompts(2, seed=1)
    store = PrefixStore()
    with torch.no_grad():
        turn = DirectDecoder(model, [first], [None], 8, 0)
        said = []
        for _ in range(5):
            said.append(int(turn.logits[0].argmax()))
            turn.step([said[-1]])
        said.append(int(turn.logits[0].argmax()))
        store.put(first + said[:-1], turn.row_cache(0))
        second = first + said + [7, 8, 9, 10]
        entry = store.take(second)
        assert entry is not None and entry.ids == first + said[:-1]
        warm = greedy(DirectDecoder(model, [second, fresh], [entry, None], 8, 0), 6, {})
        cold = greedy(DirectDecoder(model, [second, fresh], [None, None], 8, 0), 6, {})
    for a, b in zip(warm, cold, strict=True):
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()


def test_the_prefix_store_finds_the_longest_confirmed_prefix_and_forgets() -> None:
    store = PrefixStore(max_bytes=70)  # an entry of n tokens: 2 tensors of n float32 (8n bytes)

    def layers(n: int) -> list[tuple[Any, Any]]:
        return [(torch.zeros(1, n, 1), torch.zeros(1, n, 1))]

    store.put([1, 2, 3], layers(3))
    store.put([1, 2, 3, 4, 5], layers(5))
    found = store.take([1, 2, 3, 4, 5, 6])
    assert found is not None and found.ids == [1, 2, 3, 4, 5]
    found = store.take([1, 2, 3, 9])
    assert found is not None and found.ids == [1, 2, 3]
    assert store.take([1, 2, 3]) is None  # the last token is always computed
    assert store.take([1, 2, 4, 4, 5, 6]) is None  # same length, other ids
    store.put([7, 8], layers(2))  # 24 + 40 + 16 bytes: the least recently used one goes
    found = store.take([1, 2, 3, 4, 5, 6])
    assert len(store) == 2 and found is not None and found.ids == [1, 2, 3]
    assert store.take([7, 8, 1]) is not None
    store.clear()
    assert len(store) == 0 and store.nbytes == 0


def test_the_engine_forgets_its_prefix_cache_when_the_weights_change() -> None:
    engine = LocalEngine(qwen2(), Tokenizer())
    engine.generate_batch([GenerationRequest(prompts(1)[0], 4, temperature=0)])
    assert len(engine.prefix_store) == 1
    engine.load_state_dict(engine.model.state_dict())
    assert len(engine.prefix_store) == 0


def test_other_architectures_decode_through_transformers() -> None:
    """A Llama (no direct decoder): the engine's greedy tokens are transformers' own."""
    model = llama()
    assert not supports_direct(model)
    engine = LocalEngine(model, Tokenizer())
    prompt = prompts(1)[0]
    [result] = engine.generate_batch([GenerationRequest(prompt, 6, temperature=0)])
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=1
        )[0, len(prompt) :].tolist()
    assert result.ids == expected[: len(result.ids)] and len(engine.prefix_store) == 0
