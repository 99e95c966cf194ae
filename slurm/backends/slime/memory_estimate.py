"""What one training GPU holds at its fullest, and what one node's host memory holds, estimated
before a GPU is allocated. The GPU: weights, gradients, Adam's states, activations of the
largest micro-batch, its fp32 logits and the log-softmax slime keeps of them, and a fixed
allowance for the runtime, in GiB against the GPU's MiB as nvidia-smi reports them. The host:
Adam's states when they live in CPU memory, slime's pinned weight backups (the actor, the
reference), torch_memory_saver's CPU backup while the trainer sleeps. The estimates are
arithmetic on the model's config.json and the recipe, printed term by term when they pass the
memory there is, so a user sees which setting to change (docs/slime.md, "Memory estimate",
derives each term).

Only the trainer is estimated: with colocate, slime offloads SGLang while Megatron trains
(and the other way round), and without it they have their own GPUs. A dense decoder with
SwiGLU and grouped-query attention is assumed (Qwen2/2.5/3, Llama, GLM-4); a mixture of
experts is not estimated (its experts' parallelism changes every term).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurm.backends.slime.config import max_tokens_per_gpu
from slurm.backends.slime.model_context import text_config
from slurm.config import ExperimentConfig

GIB = 2**30
RUNTIME_GIB = 5.0  # CUDA context, NCCL buffers, allocator fragmentation: an allowance
HOST_RUNTIME_GIB = 6.0  # per GPU on the host: a trainer or SGLang process, Ray; an allowance
CHUNKS = (8192, 4096, 2048, 1024)  # --log-probs-chunk-size candidates, the largest that fits
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
    terms: list[tuple[str, float, str]]  # (what, GiB, how it was computed)
    budget_gib: float  # what there is: the GPU's (or the node's) memory
    where: str = "per GPU"
    chunk_size: int = 0  # the --log-probs-chunk-size the estimate assumed (0: none)

    @property
    def total_gib(self) -> float:
        return sum(gib for _, gib, _ in self.terms)

    def fits(self) -> bool:
        return self.total_gib <= self.budget_gib

    def describe(self) -> str:
        lines = [f"  {what:<13} {gib:7.1f} GiB  {how}" for what, gib, how in self.terms]
        lines.append(
            f"  {'total':<13} {self.total_gib:7.1f} GiB  of {self.budget_gib:.1f} GiB {self.where}"
        )
        return "\n".join(lines)


def log_probs_chunk_size(config: ExperimentConfig, model_config: dict[str, Any] | None) -> int:
    """--log-probs-chunk-size for the argv: the configured one, or (-1) the largest chunk that
    lets the training GPU's estimate fit when it would not fit unchunked; 0 = not passed."""
    configured = config.slime.parallelism.log_probs_chunk_size
    if configured >= 0 or model_config is None:
        return max(configured, 0)
    unchunked = estimate(config, model_config, chunk_size=0)
    if unchunked is None or unchunked.fits():
        return 0
    for chunk in CHUNKS:
        chunked = estimate(config, model_config, chunk_size=chunk)
        if chunked is not None and chunked.fits() and chunked.total_gib < unchunked.total_gib:
            return chunk
    return 0  # chunking cannot make it fit: the warning says what does


@dataclass(frozen=True)
class Layout:
    """How the model is split over the actor's GPUs."""

    shard: float  # parameters on the fullest GPU (pipeline stage 0)
    dp_cp: int  # the distributed optimizer shards over DP x CP
    layers: int  # stage 0's layers
    description: str


def layout(config: ExperimentConfig, shape: ModelShape) -> Layout:
    slime = config.slime
    parallel, resources = slime.parallelism, slime.resources
    tp, pp = parallel.tensor, parallel.pipeline
    gpus = resources.actor_num_nodes * resources.actor_num_gpus_per_node
    layers = -(-shape.layers // pp)
    stage_embeddings = shape.embedding_parameters() if pp == 1 else shape.vocab * shape.hidden
    shard = (layers * shape.layer_parameters() + stage_embeddings) / tp
    text = f"{shard / 1e9:.2f} B params/GPU ({shape.parameters() / 1e9:.1f} B / TP {tp}"
    text += f" / PP {pp})" if pp > 1 else ")"
    return Layout(shard, max(1, gpus // (tp * pp)), layers, text)


def estimate(
    config: ExperimentConfig, model_config: dict[str, Any], chunk_size: int | None = None
) -> MemoryEstimate | None:
    """The fullest training GPU (pipeline stage 0), or None for a model not covered.
    `chunk_size`: the --log-probs-chunk-size to assume (None: the one the argv passes)."""
    shape = ModelShape.from_config(model_config)
    if shape is None:
        return None
    if chunk_size is None:
        chunk_size = log_probs_chunk_size(config, model_config)
    slime = config.slime
    parallel, resources, rollout = slime.parallelism, slime.resources, slime.rollout
    tp, pp, cp = parallel.tensor, parallel.pipeline, parallel.context
    split = layout(config, shape)
    shard, dp_cp, layers = split.shard, split.dp_cp, split.layers
    terms: list[tuple[str, float, str]] = [
        ("weights", 2 * shard / GIB, f"bf16 x {split.description}")
    ]
    fp32_grads = slime.misc.accumulate_allreduce_grads_in_fp32
    terms.append(
        (
            "gradients",
            (4 if fp32_grads else 2) * shard / GIB,
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
                12 * shard / dp_cp / GIB,
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
        terms.append(("activations", total / GIB, how + ", + one group recomputed"))
    else:
        what = "selective recompute" if parallel.recompute_granularity else "no recompute"
        stored = layers * full_layer * in_flight
        terms.append(("activations", stored / GIB, f"{what}: {tokens} tokens x {layers} layers"))
    shard_vocab = shape.vocab / tp
    logits = 2 * 4 * tokens * shard_vocab
    terms.append(("logits", logits / GIB, f"fp32 logits and their gradient, {tokens} tokens"))
    terms.append(log_softmax_term(slime.algorithm.entropy_coef, tokens, shard_vocab, chunk_size))
    terms.append(("runtime", RUNTIME_GIB, "CUDA context, NCCL, fragmentation (allowance)"))
    return MemoryEstimate(terms, resources.gpu_memory_mib / 1024, "per GPU", chunk_size)


def log_softmax_term(
    entropy_coef: float, tokens: int, shard_vocab: float, chunk_size: int
) -> tuple[str, float, str]:
    """slime's log-probability and entropy (slime/utils/ppo_utils.py,
    `_VocabParallelLogProbEntropy`) keep one fp32 softmax of the logits' vocabulary shard for
    the backward pass, whatever the chunking (each chunk keeps its own); with an entropy loss
    (entropy_coef != 0) the backward builds one more such buffer, per chunk when chunked."""
    kept = 4 * tokens * shard_vocab
    how = f"fp32 softmax kept for backward, {tokens} x {shard_vocab:.0f}"
    if entropy_coef:
        rows = min(tokens, chunk_size) if chunk_size else tokens
        kept += 4 * rows * shard_vocab
        how += f" + the entropy gradient's, {rows} rows"
        if chunk_size:
            how += f" (--log-probs-chunk-size {chunk_size})"
    return ("log-softmax", kept / GIB, how)


def host_estimate(
    config: ExperimentConfig, model_config: dict[str, Any], node_gib: float
) -> MemoryEstimate | None:
    """One node's host memory while it trains (the actor's GPUs on it, each rank's share), or
    None for a model not covered: Adam's states in CPU memory (with cpu_offload: the fp32
    master, m and v and the gradients copied to the host, sharded over DP x CP), slime's pinned
    CPU backups of the weights (slime/utils/tensor_backper.py: the actor always, the reference
    when KL is used, slime/ray/placement_group.py:178), torch_memory_saver's CPU backup of what
    the sleeping trainer leaves on the GPU (--offload: TMS_INIT_ENABLE_CPU_BACKUP=1,
    slime/ray/actor_group.py:94, parameters and gradient buffers excluded,
    slime/utils/arguments.py:1964-1966: the optimizer's states when they are on the GPU), and
    an allowance per GPU for its processes."""
    shape = ModelShape.from_config(model_config)
    if shape is None:
        return None
    slime = config.slime
    split = layout(config, shape)
    ranks = slime.resources.actor_num_gpus_per_node
    per_rank = f"{ranks} ranks x {split.shard / 1e9:.2f} B params"
    terms: list[tuple[str, float, str]] = []
    optimizer = 12 * split.shard / split.dp_cp
    if slime.optimizer.cpu_offload:
        adam = ranks * 16 * split.shard / split.dp_cp
        how = f"fp32 master, m, v, gradients = 16 bytes x {per_rank} / DP x CP {split.dp_cp}"
        terms.append(("Adam on CPU", adam / GIB, how))
    backups = 2 if (slime.algorithm.use_kl_loss or slime.algorithm.kl_coef) else 1
    names = "actor and reference" if backups == 2 else "actor"
    terms.append(
        (
            "weight backups",
            ranks * 2 * split.shard * backups / GIB,
            f"bf16 x {per_rank} x {backups} ({names}, pinned)",
        )
    )
    if slime.resources.offload and not slime.optimizer.cpu_offload:
        how = f"the GPU's Adam states while the trainer sleeps: 12 bytes x {per_rank} / DP x CP"
        terms.append(("memory saver", ranks * optimizer / GIB, how))
    gpus = config.slurm.gpus_per_node
    terms.append(
        ("runtime", gpus * HOST_RUNTIME_GIB, f"{HOST_RUNTIME_GIB:g} GiB x {gpus} GPUs (allowance)")
    )
    return MemoryEstimate(terms, node_gib, "per node")
