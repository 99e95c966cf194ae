"""What one training GPU holds at its fullest, estimated before a GPU is allocated: weights,
gradients, Adam's states, activations of the largest micro-batch, its logits, and a fixed
allowance for the runtime. The estimate is arithmetic on the model's config.json and the
recipe, printed term by term when it passes the GPU's memory, so a user sees which setting to
change (docs/slime.md, "Memory estimate", derives each term).

Only the trainer is estimated: with colocate, slime offloads SGLang while Megatron trains
(and the other way round), and without it they have their own GPUs. A dense decoder with
SwiGLU and grouped-query attention is assumed (Qwen2/2.5/3, Llama, GLM-4); a mixture of
experts is not estimated (its experts' parallelism changes every term).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm.backends.slime.args import max_tokens_per_gpu
from slurm.backends.slime.model_context import text_config
from slurm.config import ExperimentConfig

GB = 1e9
RUNTIME_GB = 5.0  # CUDA context, NCCL buffers, allocator fragmentation: an allowance
MOE_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_intermediate_size")


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # input and output embeddings share one matrix

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape | None:
        """None for a config this estimate does not cover (a mixture of experts, missing keys)."""
        text = text_config(config)
        if any(text.get(key) for key in MOE_KEYS):
            return None
        try:
            hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
            return cls(
                layers=int(text["num_hidden_layers"]),
                hidden=hidden,
                ffn=int(text["intermediate_size"]),
                heads=heads,
                kv_heads=int(text.get("num_key_value_heads") or heads),
                head_dim=int(text.get("head_dim") or hidden // heads),
                vocab=int(text["vocab_size"]),
                tied=bool(text.get("tie_word_embeddings", False)),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def layer_parameters(self) -> int:
        """Attention (Q, K, V, output; biases and norms are negligible) and the SwiGLU MLP."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        return attention + 3 * self.hidden * self.ffn

    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def parameters(self) -> int:
        return self.layers * self.layer_parameters() + self.embedding_parameters()


@dataclass(frozen=True)
class MemoryEstimate:
    terms: list[tuple[str, float, str]]  # (what, GB, how it was computed)
    gpu_gb: float

    @property
    def total_gb(self) -> float:
        return sum(gb for _, gb, _ in self.terms)

    def fits(self) -> bool:
        return self.total_gb <= self.gpu_gb

    def describe(self) -> str:
        lines = [f"  {what:<12} {gb:6.1f} GB  {how}" for what, gb, how in self.terms]
        lines.append(f"  {'total':<12} {self.total_gb:6.1f} GB  of {self.gpu_gb:g} GB per GPU")
        return "\n".join(lines)


def estimate(config: ExperimentConfig, model_config: dict[str, Any]) -> MemoryEstimate | None:
    """The fullest training GPU (pipeline stage 0), or None for a model not covered."""
    shape = ModelShape.from_config(model_config)
    if shape is None:
        return None
    slime = config.slime
    parallel, resources, rollout = slime.parallelism, slime.resources, slime.rollout
    tp, pp, cp = parallel.tensor, parallel.pipeline, parallel.context
    gpus = resources.actor_num_nodes * resources.actor_num_gpus_per_node
    dp_cp = max(1, gpus // (tp * pp))  # the distributed optimizer shards over DP x CP
    layers = -(-shape.layers // pp)  # stage 0's layers
    stage_embeddings = shape.embedding_parameters() if pp == 1 else shape.vocab * shape.hidden
    shard = (layers * shape.layer_parameters() + stage_embeddings) / tp
    shard_b = f"{shard / 1e9:.2f} B params/GPU ({shape.parameters() / 1e9:.1f} B / TP {tp}"
    shard_b += f" / PP {pp})" if pp > 1 else ")"
    terms: list[tuple[str, float, str]] = [("weights", 2 * shard / GB, f"bf16 x {shard_b}")]
    fp32_grads = slime.misc.accumulate_allreduce_grads_in_fp32
    terms.append(
        (
            "gradients",
            (4 if fp32_grads else 2) * shard / GB,
            ("fp32 (accumulate-allreduce-grads-in-fp32)" if fp32_grads else "bf16")
            + " x params/GPU",
        )
    )
    if slime.optimizer.cpu_offload:
        terms.append(("optimizer", 0.0, "Adam's states in CPU memory (cpu_offload)"))
    else:
        terms.append(
            (
                "optimizer",
                12 * shard / dp_cp / GB,
                f"fp32 master + Adam m, v = 12 bytes x params/GPU / DP x CP {dp_cp}",
            )
        )
    # the largest micro-batch: up to max_tokens_per_gpu x CP tokens, or one longest episode
    if parallel.use_dynamic_batch_size:
        batch = max(max_tokens_per_gpu(slime) * cp, rollout.max_context_len)
    else:
        batch = rollout.max_context_len  # micro-batch size 1
    tokens = -(-batch // cp)
    sp = tp if parallel.sequence_parallel else 1
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    # bytes a layer keeps per token for its backward pass (bf16): the two norms' inputs and
    # outputs (sharded by sequence parallelism), Q/K/V, attention output and the output
    # projection's input, the MLP's gate, up and SwiGLU output (sharded by TP); flash
    # attention keeps no s x s matrix
    per_token_layer = 2 * (4 * h) / sp + 2 * (h + 2 * kv + 2 * h) / tp + 2 * (3 * shape.ffn) / tp
    in_flight = pp  # 1F1B: stage 0 holds PP micro-batches
    layer_input = tokens * 2 * h / sp
    full_layer = tokens * per_token_layer
    if parallel.recompute_granularity == "full":
        group = max(1, parallel.recompute_num_layers)
        if parallel.recompute_method == "block":  # the first `group` layers only
            recomputed = min(group, layers)
            stored = recomputed * layer_input + (layers - recomputed) * full_layer
            how = f"full recompute of {recomputed} of {layers} layers, {tokens} tokens"
            working = full_layer
        else:  # uniform: one checkpointed input per group of `group` layers
            stored = -(-layers // group) * layer_input
            how = f"full recompute: {layers} layers' inputs, {tokens} tokens"
            working = group * full_layer
        total = stored * in_flight + working
        terms.append(("activations", total / GB, how + ", + one group recomputed"))
    else:
        what = "selective recompute" if parallel.recompute_granularity else "no recompute"
        stored = layers * full_layer * in_flight
        terms.append(("activations", stored / GB, f"{what}: {tokens} tokens x {layers} layers"))
    logits = 2 * 4 * tokens * shape.vocab / tp
    terms.append(("logits", logits / GB, f"fp32 logits and their gradient, {tokens} tokens"))
    terms.append(("runtime", RUNTIME_GB, "CUDA context, NCCL, fragmentation (allowance)"))
    return MemoryEstimate(terms, resources.gpu_memory_gb)
