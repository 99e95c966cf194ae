"""The forward passes of one engine batch: its prompts' pass, then one pass per decoded token,
for the rows still decoding.

Two ways to run them, the same tokens either way (tests/deepdive/test_decoder.py):

- `DirectDecoder`, for the Qwen2 family (the embedded default and DeepDive's base models): the
  model's own layers called in turn over a KV cache allocated once per batch, each new token's
  keys and values written in place. Through transformers' generic forward each decoded token
  rebuilt the attention masks and concatenated the whole cache anew: a decode pass of the
  embedded default took 3.5 ms, two thirds of it that machinery. Rows may start from a
  finished row's cache (`deepdive.local.prefix_store`): their pass then covers only the tokens
  after it.
- `TransformersDecoder`, for any other causal LM: transformers' forward with its own cache.

Rows are left-padded so that every row's newest token is in the same column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from deepdive.local.model import logits_to_keep
from deepdive.local.prefix_store import Entry, Layers


class Decoder(Protocol):
    logits: Any  # [rows, vocabulary]: the next token's scores of each row still decoding

    def step(self, next_ids: list[int]) -> None:
        """Feed each row its newest token; `logits` become the scores after it."""
        ...

    def keep(self, slots: list[int]) -> None:
        """Only these rows (by their place in the batch) decode on; `logits` are theirs."""
        ...

    def row_cache(self, slot: int) -> Layers | None:
        """The keys and values of every token the row has fed, or None where not kept."""
        ...


def supports_direct(model: Any) -> bool:
    """A Qwen2 causal LM with full attention in every layer, run by transformers' SDPA or
    eager attention (the arithmetic `DirectDecoder` repeats)."""
    config = getattr(model, "config", None)
    return (
        type(model).__name__ == "Qwen2ForCausalLM"
        and config is not None
        and "sliding_attention" not in (getattr(config, "layer_types", None) or [])
        and getattr(config, "_attn_implementation", "sdpa") in ("sdpa", "eager")
    )


class TransformersDecoder:
    def __init__(self, model: Any, prompts: Sequence[list[int]], pad_id: int) -> None:
        import torch

        self.model = model
        device = next(model.parameters()).device
        self.device = device
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
        self.mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device
        )
        self.positions = (self.mask.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=self.positions,
            use_cache=True,
            # only the last position onto the vocabulary: the projection of every
            # position was a third of a 450-token prompt pass of the embedded default
            **logits_to_keep(model, 1),
        )
        self.cache, self.logits = out.cache, out.logits[:, -1, :].float()

    def step(self, next_ids: list[int]) -> None:
        import torch

        rows = len(next_ids)
        self.mask = torch.cat(
            [self.mask, torch.ones((rows, 1), dtype=self.mask.dtype, device=self.device)], dim=-1
        )
        self.positions = self.positions[:, -1:] + 1
        out = self.model(
            input_ids=torch.tensor([next_ids], device=self.device).T,
            attention_mask=self.mask,
            position_ids=self.positions,
            cache=self.cache,
            use_cache=True,
        )
        self.cache, self.logits = out.cache, out.logits[:, -1, :].float()

    def keep(self, slots: list[int]) -> None:
        import torch

        keep = torch.tensor(slots, device=self.device)
        self.cache.batch_select_indices(keep)
        self.mask, self.positions = self.mask[keep], self.positions[keep]
        self.logits = self.logits[keep]

    def row_cache(self, slot: int) -> Layers | None:
        return None


class DirectDecoder:
    """`prompts[i]` may start with `cached[i]`, a finished row's entry: its keys and values
    are copied in, and the prompt pass computes the tokens after it."""

    def __init__(
        self,
        model: Any,
        prompts: Sequence[list[int]],
        cached: Sequence[Entry | None],
        new_tokens: int,
        pad_id: int,
    ) -> None:
        import torch

        self.model = model
        self.body = model.model
        config = model.config
        embed = self.body.embed_tokens.weight
        self.device, dtype = embed.device, embed.dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        lengths = [len(p) for p in prompts]
        known = [
            min(len(entry.ids), length - 1) if entry is not None else 0
            for entry, length in zip(cached, lengths, strict=True)
        ]
        width = max(lengths)
        block = max(length - k for length, k in zip(lengths, known, strict=True))
        capacity = width + max(1, new_tokens)
        rows = len(prompts)
        self.keys = [
            torch.zeros(
                (rows, self.kv_heads, capacity, self.head_dim), dtype=dtype, device=self.device
            )
            for _ in self.body.layers
        ]
        self.values = [torch.zeros_like(k) for k in self.keys]
        self.starts = [width - length for length in lengths]  # each row's first column
        starts = torch.tensor(self.starts, device=self.device)
        columns = torch.arange(capacity, device=self.device)
        self.valid = (columns[None, :] >= starts[:, None]) & (columns[None, :] < width)
        for row, entry in enumerate(cached):
            if entry is not None and known[row]:
                span = slice(self.starts[row], self.starts[row] + known[row])
                for layer, (k, v) in enumerate(entry.layers):
                    self.keys[layer][row, :, span] = k[:, : known[row]]
                    self.values[layer][row, :, span] = v[:, : known[row]]
        # the prompt pass: the last `block` columns; in each row, the tokens after its cached
        # ones are written, the earlier ones (cached, or padding) kept as they are
        offsets = [
            [length - block + t for t in range(block)] for length in lengths
        ]  # index in the row's prompt of each column of the pass
        tokens = torch.tensor(
            [
                [prompt[i] if i >= 0 else pad_id for i in row_offsets]
                for prompt, row_offsets in zip(prompts, offsets, strict=True)
            ],
            device=self.device,
        )
        index = torch.tensor(offsets, device=self.device)
        writes = index >= torch.tensor(known, device=self.device)[:, None]
        query_columns = width - block + torch.arange(block, device=self.device)
        allowed = self.valid[:, None, :width] & (
            columns[None, None, :width] <= query_columns[None, :, None]
        )
        # a padding query attends to itself alone (its output is dropped): no row of the
        # softmax is empty
        allowed[:, torch.arange(block), query_columns] = True
        self.filled = width - block
        self.logits = self._forward(tokens, index.clamp(min=0), allowed[:, None], writes)
        self.filled = width
        self.positions = torch.tensor(lengths, device=self.device)

    def step(self, next_ids: list[int]) -> None:
        import torch

        column = self.filled
        self.valid[:, column] = True
        tokens = torch.tensor(next_ids, device=self.device)[:, None]
        allowed = self.valid[:, None, None, : column + 1]
        self.logits = self._forward(tokens, self.positions[:, None], allowed, None)
        self.filled += 1
        self.positions = self.positions + 1

    def keep(self, slots: list[int]) -> None:
        import torch

        keep = torch.tensor(slots, device=self.device)
        self.keys = [k.index_select(0, keep) for k in self.keys]
        self.values = [v.index_select(0, keep) for v in self.values]
        self.valid, self.positions = self.valid[keep], self.positions[keep]
        self.logits = self.logits[keep]
        self.starts = [self.starts[slot] for slot in slots]

    def row_cache(self, slot: int) -> Layers:
        span = slice(self.starts[slot], self.filled)
        return [
            (k[slot, :, span].clone(), v[slot, :, span].clone())
            for k, v in zip(self.keys, self.values, strict=True)
        ]

    def _forward(self, tokens: Any, positions: Any, allowed: Any, writes: Any) -> Any:
        """Tokens [rows, n] in the columns from `self.filled` on; `allowed` [rows, 1, n,
        keys] says which columns each attends to; `writes` [rows, n] which of their keys and
        values enter the cache (None: all). Returns the last column's next-token scores."""
        import torch
        from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

        rows, count = tokens.shape
        first = self.filled
        hidden = self.body.embed_tokens(tokens)
        cos, sin = self.body.rotary_emb(hidden, positions)
        groups = self.heads // self.kv_heads
        for layer, block in enumerate(self.body.layers):
            attention = block.self_attn
            x = block.input_layernorm(hidden)
            q = attention.q_proj(x).view(rows, count, self.heads, self.head_dim).transpose(1, 2)
            k = attention.k_proj(x).view(rows, count, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attention.v_proj(x).view(rows, count, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            span = slice(first, first + count)
            if writes is None:
                self.keys[layer][:, :, span] = k
                self.values[layer][:, :, span] = v
            else:
                gate = writes[:, None, :, None]
                self.keys[layer][:, :, span] = torch.where(gate, k, self.keys[layer][:, :, span])
                self.values[layer][:, :, span] = torch.where(
                    gate, v, self.values[layer][:, :, span]
                )
            end = first + count
            keys, values = self.keys[layer][:, :, :end], self.values[layer][:, :, :end]
            if groups > 1:
                keys = keys.repeat_interleave(groups, dim=1)
                values = values.repeat_interleave(groups, dim=1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q, keys, values, attn_mask=allowed, scale=self.scaling
            )
            out = out.transpose(1, 2).reshape(rows, count, self.heads * self.head_dim)
            hidden = hidden + attention.o_proj(out)
            hidden = hidden + block.mlp(block.post_attention_layernorm(hidden))
        last = self.body.norm(hidden[:, -1:])
        return self.model.lm_head(last)[:, -1, :].float()
