"""Token ids of observations, the rollout's largest CPU cost per turn after HTTP.

Two savings, both exact (the ids are the ones `tokenizer.encode(text, add_special_tokens=False)`
gives):
- a Hugging Face fast tokenizer is called through its Rust `tokenizers.Tokenizer` directly,
  skipping transformers' per-call argument handling (about two thirds of an encode of a short
  observation), when nothing transformers would change is configured on it (truncation,
  padding, split special tokens);
- ids are kept by text, least recently used dropped first, up to a budget of tokens: a GRPO
  group's samples repeat each other's first searches, so their observations repeat too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cachetools import LRUCache

# Tokens kept per process (about 36 bytes each as Python ints in a tuple): ~36 MB at most.
DEFAULT_BUDGET_TOKENS = 1_000_000


def fast_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """The cheapest exact `text -> ids` for this tokenizer (no special tokens added)."""
    backend: Any = getattr(tokenizer, "backend_tokenizer", None)
    plain = (
        backend is not None
        and callable(getattr(backend, "encode", None))
        and getattr(backend, "truncation", None) is None
        and getattr(backend, "padding", None) is None
        and not getattr(backend, "encode_special_tokens", False)
        and not getattr(tokenizer, "split_special_tokens", False)
    )
    if plain:

        def encode_rust(text: str) -> list[int]:
            ids: list[int] = backend.encode(text, add_special_tokens=False).ids
            return ids

        return encode_rust

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    return encode


class ObservationTokens:
    """`ids(text)`: the observation's token ids, from the cache when this text was seen."""

    def __init__(self, tokenizer: Any, budget_tokens: int = DEFAULT_BUDGET_TOKENS) -> None:
        self._encode = fast_encoder(tokenizer)
        self._cache: LRUCache[str, tuple[int, ...]] = LRUCache(
            maxsize=budget_tokens, getsizeof=lambda ids: max(1, len(ids))
        )
        self.hits = 0
        self.misses = 0

    def encode(self, text: str) -> list[int]:
        """Ids of a text seen once (the prompt), through the fast path, not kept."""
        return self._encode(text)

    def ids(self, text: str) -> tuple[int, ...]:
        cached = self._cache.get(text)
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        ids = tuple(self._encode(text))
        if len(ids) <= self._cache.maxsize:
            self._cache[text] = ids
        return ids


_MAX_TOKENIZERS = 8
_BY_TOKENIZER: dict[int, tuple[Any, ObservationTokens]] = {}


def observation_tokens(tokenizer: Any) -> ObservationTokens:
    """The one cache for this tokenizer object in this process (the rollout's tokenizer lives as
    long as the process, so keeping it referenced here costs nothing)."""
    entry = _BY_TOKENIZER.get(id(tokenizer))
    if entry is None or entry[0] is not tokenizer:
        if len(_BY_TOKENIZER) >= _MAX_TOKENIZERS:  # tests make many; a rollout has one
            _BY_TOKENIZER.clear()
        entry = _BY_TOKENIZER[id(tokenizer)] = (tokenizer, ObservationTokens(tokenizer))
    return entry[1]
