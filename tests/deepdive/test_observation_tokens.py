"""Observation ids (deepdive/observation_tokens.py) are exactly what the tokenizer's own
`encode(text, add_special_tokens=False)` gives: through the Rust tokenizer directly when nothing
transformers would change is configured, through transformers otherwise; and the cache by text
returns the same ids, bounded by its token budget."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepdive.local.model import train_tokenizer
from deepdive.observation_tokens import ObservationTokens, fast_encoder
from fakes.sglang import ByteTokenizer
from tests.hostile import model_turns, unicode_text


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    texts = [
        "Which clockmaker built the silver orrery of Haldor? " * 20,
        "<tool_response>\n【1】Orrery\nhttps://o.example/\nA model.\n</tool_response>" * 20,
        "北京 東京 Ünïcödé café naïve 🙂 " * 20,
    ]
    return train_tokenizer(texts, vocab_size=400)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(unicode_text, model_turns, st.text(max_size=400)))
def test_the_fast_path_gives_the_tokenizers_own_ids(tokenizer: Any, text: str) -> None:
    assert fast_encoder(tokenizer)(text) == tokenizer.encode(text, add_special_tokens=False)


def test_the_fast_path_is_the_rust_tokenizer_only_when_nothing_is_configured(
    tokenizer: Any,
) -> None:
    text = "<|im_start|>user\nthe silver orrery of Haldor, again and again<|im_end|>"
    assert fast_encoder(tokenizer).__name__ == "encode_rust"
    tokenizer.backend_tokenizer.enable_truncation(3)
    try:
        encode = fast_encoder(tokenizer)
        assert encode.__name__ == "encode"  # through transformers, which decides truncation
        assert encode(text) == tokenizer.encode(text, add_special_tokens=False)
    finally:
        tokenizer.backend_tokenizer.no_truncation()


def test_a_tokenizer_without_a_backend_is_called_as_it_is() -> None:
    assert fast_encoder(ByteTokenizer())("é!") == list("é!".encode())


def test_the_cache_returns_the_same_ids_and_keeps_to_its_budget(tokenizer: Any) -> None:
    cache = ObservationTokens(tokenizer, budget_tokens=50)
    first = cache.ids("the silver orrery of Haldor")
    assert cache.ids("the silver orrery of Haldor") == first
    assert (cache.hits, cache.misses) == (1, 1)
    assert list(first) == tokenizer.encode("the silver orrery of Haldor", add_special_tokens=False)
    for k in range(40):
        cache.ids(f"observation number {k} about clockmakers")
    assert cache._cache.currsize <= 50
    long_text = "word " * 200  # more tokens than the whole budget: answered, never kept
    assert list(cache.ids(long_text)) == tokenizer.encode(long_text, add_special_tokens=False)
    assert long_text not in cache._cache
