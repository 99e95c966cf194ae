"""The local engine's KV cache of finished rows, found again by the requests that extend them.

An episode's next turn is its previous request, the tokens the engine generated for it and the
tool's observation: everything but the observation was already computed once. A finished row's
keys and values are kept here under its token ids, and a request that begins with them prefills
only the rest (SGLang keeps a radix tree for the same reason). Entries are found by the length
and a fingerprint of the ids, confirmed by comparing the ids themselves, dropped least recently
used first past `max_bytes`, and all dropped when the weights change.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

# one (keys, values) pair per layer, each [kv heads, tokens, head dim]
Layers = list[tuple[Any, Any]]

_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: every power is distinct modulo 2**64


@dataclass
class Entry:
    ids: list[int]
    layers: Layers
    nbytes: int


def fingerprints(ids: list[int]) -> Any:
    """f[j] for each prefix ids[:j] (f[0] = 0): the sum of ids[k] * M**(k+1) modulo 2**64."""
    if not ids:
        return np.zeros(1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(len(ids), _MULTIPLIER, dtype=np.uint64), dtype=np.uint64)
        terms = np.asarray(ids, dtype=np.uint64) * powers
        return np.concatenate([np.zeros(1, dtype=np.uint64), np.cumsum(terms, dtype=np.uint64)])


class PrefixStore:
    def __init__(self, max_bytes: int = 256 * 2**20) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0
        self._entries: OrderedDict[tuple[int, int], Entry] = OrderedDict()
        self._lengths: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ids: list[int], layers: Layers) -> None:
        """Keep `layers`, the keys and values of exactly `ids`."""
        if not ids:
            return
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if nbytes > self.max_bytes:
            return
        key = (len(ids), int(fingerprints(ids)[-1]))
        self._drop(key)
        self._entries[key] = Entry(list(ids), layers, nbytes)
        self._lengths[len(ids)] += 1
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def take(self, ids: list[int]) -> Entry | None:
        """The longest kept prefix of `ids` shorter than `ids` (the last token is always
        prefilled: its logits are the first sample's). It stays: a group's samples often say
        the same first turn, and each of their second turns extends it."""
        if not self._entries or len(ids) < 2:
            return None
        prints = fingerprints(ids)
        for length in sorted(self._lengths, reverse=True):
            if length >= len(ids):
                continue
            entry = self._entries.get((length, int(prints[length])))
            if entry is not None and entry.ids == ids[:length]:
                self._entries.move_to_end((length, int(prints[length])))
                self.hits += 1
                self.reused_tokens += length
                return entry
        return None

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self.nbytes = 0

    def _drop(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self.nbytes -= entry.nbytes
        self._lengths[key[0]] -= 1
        if not self._lengths[key[0]]:
            del self._lengths[key[0]]
