"""`backend = "slime"`: slime's GRPO recipe as typed tables (`[slime.*]` of the experiment file), one per argument group of slime's
own launch scripts, each key named after the slime flag it becomes (slurm/backends/slime/args.py writes
them; every flag is checked against slime's flag list before submission, slurm/backends/slime/checks.py).

    [slime.model]         preset or explicit architecture arguments; hf_checkpoint, ref_load
    [slime.checkpoint]    save_interval (the run folder's checkpoints are --save and --load)
    [slime.parallelism]   TP, PP, CP, EP, sequence parallel, recompute, dynamic batch size
    [slime.resources]     actor nodes and GPUs per node, rollout GPUs and GPUs per engine,
                          colocate, the GPUs' memory (for the memory estimate)
    [slime.rollout]       prompt data and keys, batch sizes, lengths, temperature, top-p, over-sampling
    [slime.algorithm]     grpo | gspo | ppo | reinforce_plus_plus, KL, clipping, entropy
    [slime.optimizer]     lr, schedule, weight decay, Adam, CPU offload
    [slime.sglang]        memory fraction, context length, log level, router
    [slime.misc]          dropout, fp32 accumulation and softmax, attention backend (the MISC_ARGS
                          every slime run script passes)
    [slime.fault_tolerance]  --use-fault-tolerance with a first wait
    [slime.eval]          named eval sets, samples per prompt, interval
    [slime.deepdive]      our rollout's keys (the --custom-config-path YAML)
    [slime] extra_args    anything else, checked against the flag list too

What only the slime backend needs (a model, prompt data) is checked when the backend is slime
(slurm/backends/slime/checks.py), so a local experiment carries these tables unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from deepdive.rollout_settings import RolloutKnobs
from services.base.typed_config import require

Estimator = Literal["grpo", "gspo", "ppo", "reinforce_plus_plus"]
# sglang-router 0.3.2's --policy choices (its router_args.py): consistent_hashing exists in its
# Rust code but not among them, so slime's parser refuses it
RouterPolicy = Literal["manual", "cache_aware", "round_robin", "random", "power_of_two"]


@dataclass(frozen=True)
class SlimeModel:
    """preset: a name in slurm/backends/slime/presets.json (from slime's scripts/models), or
    architecture: Megatron's architecture arguments spelled out; not both."""

    preset: str = ""
    architecture: list[str] = field(default_factory=list)
    hf_checkpoint: str = ""  # the Hugging Face model (tokenizer, SGLang's weights)
    ref_load: str = ""  # its torch_dist conversion (`deepdive convert-checkpoint to-megatron`)

    def __post_init__(self) -> None:
        require(
            not (self.preset and self.architecture),
            "slime.model.preset",
            "empty when slime.model.architecture is given (one of the two)",
            self.preset,
        )


@dataclass(frozen=True)
class SlimeCheckpoint:
    save_interval: int = 20  # rollouts between checkpoints (--save-interval)
    # the newest complete checkpoints kept in RUN/slime_checkpoints: node 0 removes older ones
    # once a newer save has landed, never the one the attempt resumed from
    # (slurm/backends/slime/retention.py); 0 keeps every one, as slime does
    keep_last: int = 0

    def __post_init__(self) -> None:
        require(
            self.save_interval >= 1,
            "slime.checkpoint.save_interval",
            "at least 1",
            self.save_interval,
        )
        require(self.keep_last >= 0, "slime.checkpoint.keep_last", "0 (keep all) or more",
                self.keep_last)  # fmt: skip


@dataclass(frozen=True)
class SlimeParallelism:
    tensor: int = 1  # --tensor-model-parallel-size
    pipeline: int = 1  # --pipeline-model-parallel-size
    context: int = 1  # --context-parallel-size
    expert: int = 1  # --expert-model-parallel-size
    sequence_parallel: bool = False
    expert_tensor: int = 1  # --expert-tensor-parallel-size (every slime run script passes 1)
    recompute_granularity: Literal["", "full", "selective"] = ""
    recompute_method: Literal["", "uniform", "block"] = ""
    recompute_num_layers: int = 0
    # slime packs micro-batches up to max_tokens_per_gpu tokens (x CP); a longer sample runs
    # alone (slime/utils/dp_schedule.py). 0 = max_context_len / context (slime's advice).
    use_dynamic_batch_size: bool = True
    max_tokens_per_gpu: int = 0
    # --log-probs-chunk-size: -1 = chosen by the memory estimate (passed only when the logits'
    # temporaries would not fit otherwise), 0 = never, N = N tokens per chunk
    log_probs_chunk_size: int = -1

    def __post_init__(self) -> None:
        require(
            self.log_probs_chunk_size >= -1,
            "slime.parallelism.log_probs_chunk_size",
            "-1 (the memory estimate chooses), 0 (never) or a number of tokens",
            self.log_probs_chunk_size,
        )
        require(
            self.max_tokens_per_gpu >= 0,
            "slime.parallelism.max_tokens_per_gpu",
            ">= 0 (0 = max_context_len / context)",
            self.max_tokens_per_gpu,
        )
        for name in ("tensor", "pipeline", "context", "expert", "expert_tensor"):
            value = getattr(self, name)
            require(value >= 1, f"slime.parallelism.{name}", "at least 1", value)
        require(
            not self.sequence_parallel or self.tensor > 1,
            "slime.parallelism.sequence_parallel",
            "false unless tensor > 1 (Megatron requires it)",
            self.sequence_parallel,
        )


@dataclass(frozen=True)
class SlimeResources:
    actor_num_nodes: int = 1
    actor_num_gpus_per_node: int = 8
    rollout_num_gpus: int = 8
    rollout_num_gpus_per_engine: int = 1
    colocate: bool = False  # actor and rollout share the GPUs (offloading in turn)
    offload: bool = False
    # each GPU's memory as nvidia-smi's memory.total says it (MiB; `deepdive smoke` step 1 prints
    # it): the memory estimate (GiB) warns above it. 81559: an H100 80 GB (an A100 80 GB: 81920)
    gpu_memory_mib: int = 81559

    def __post_init__(self) -> None:
        require(
            self.gpu_memory_mib > 0,
            "slime.resources.gpu_memory_mib",
            "a positive number of MiB (nvidia-smi's memory.total)",
            self.gpu_memory_mib,
        )
        for name in ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine"):
            value = getattr(self, name)
            require(value >= 1, f"slime.resources.{name}", "at least 1", value)
        require(
            self.rollout_num_gpus >= 0,
            "slime.resources.rollout_num_gpus",
            ">= 0",
            self.rollout_num_gpus,
        )
        require(
            self.rollout_num_gpus % self.rollout_num_gpus_per_engine == 0,
            "slime.resources.rollout_num_gpus",
            f"a multiple of rollout_num_gpus_per_engine ({self.rollout_num_gpus_per_engine})",
            self.rollout_num_gpus,
        )


@dataclass(frozen=True)
class SlimeRollout:
    prompt_data: str = ""  # `deepdive convert` output
    input_key: str = "input_messages"
    label_key: str = "label"
    tool_key: str = "tools"
    metadata_key: str = "metadata"
    apply_chat_template: bool = True
    rollout_batch_size: int = 16  # prompts per rollout
    n_samples_per_prompt: int = 8
    global_batch_size: int = 128  # samples per optimizer step
    num_steps_per_rollout: int = 1
    num_rollout: int = 3000
    # prompt + response of an episode (--rollout-max-context-len, Megatron's --seq-length and
    # SGLang's --sglang-context-length): at most what the model serves (slurm/backends/slime/model_context.py)
    max_context_len: int = 32_768
    max_response_len: int = 32_768  # --rollout-max-response-len: at most max_context_len
    shuffle: bool = True  # --rollout-shuffle (every slime run script passes it)
    temperature: float = 1.0
    top_p: float = 1.0
    over_sampling_batch_size: int = 0  # 0 = rollout_batch_size; more with a dynamic filter
    drop_uniform_groups: bool = False  # DAPO's dynamic sampling (deepdive.filters)
    drop_failed_groups: bool = False  # groups where every sample aborted or was malformed

    def __post_init__(self) -> None:
        for name in (
            "rollout_batch_size",
            "n_samples_per_prompt",
            "global_batch_size",
            "num_steps_per_rollout",
            "num_rollout",
            "max_context_len",
            "max_response_len",
        ):
            value = getattr(self, name)
            require(value >= 1, f"slime.rollout.{name}", "at least 1", value)
        require(
            self.temperature > 0,
            "slime.rollout.temperature",
            "> 0 (slime refuses 0)",
            self.temperature,
        )
        require(0 < self.top_p <= 1, "slime.rollout.top_p", "in (0, 1]", self.top_p)
        require(
            self.over_sampling_batch_size == 0
            or self.over_sampling_batch_size >= self.rollout_batch_size,
            "slime.rollout.over_sampling_batch_size",
            f"0 or at least rollout_batch_size ({self.rollout_batch_size})",
            self.over_sampling_batch_size,
        )


@dataclass(frozen=True)
class SlimeAlgorithm:
    advantage_estimator: Estimator = "grpo"
    use_kl_loss: bool = True
    kl_loss_type: Literal["kl", "k2", "k3", "low_var_kl"] = "low_var_kl"
    kl_loss_coef: float = 0.0
    kl_coef: float = 0.0
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    entropy_coef: float = 0.0
    calculate_per_token_loss: bool = True

    def __post_init__(self) -> None:
        for name in ("kl_loss_coef", "kl_coef", "eps_clip", "eps_clip_high", "entropy_coef"):
            value = getattr(self, name)
            require(value >= 0, f"slime.algorithm.{name}", ">= 0", value)
        require(
            self.kl_coef == 0 or self.kl_loss_coef == 0,
            "slime.algorithm.kl_coef",
            "0 when kl_loss_coef is set (slime takes one of the two)",
            self.kl_coef,
        )


@dataclass(frozen=True)
class SlimeOptimizer:
    lr: float = 2e-6
    lr_decay_style: Literal["constant", "linear", "cosine"] = "constant"
    lr_warmup_iters: int = 0
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    # Adam's states in CPU memory (slime's 32B examples: --optimizer-cpu-offload
    # --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer)
    cpu_offload: bool = False

    def __post_init__(self) -> None:
        require(self.lr > 0, "slime.optimizer.lr", "a positive number", self.lr)
        require(self.weight_decay >= 0, "slime.optimizer.weight_decay", ">= 0", self.weight_decay)


@dataclass(frozen=True)
class SlimeSGLang:
    mem_fraction_static: float = 0.8
    context_length: int = 0  # --sglang-context-length; 0 = slime.rollout.max_context_len
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    router_request_timeout_secs: int = 36_000
    # How slime's router (sglang-router 0.3.2) picks an engine for each turn: "manual" keeps
    # every session (our rollout's X-SMG-Routing-Key, one per episode) on the engine it was
    # first given, the new ones on the least loaded (assignment_mode); "cache_aware" (slime's
    # default) ignores the header and follows the longest cached prefix only while the engines'
    # loads stay within balance_abs_threshold (docs/slime.md, "The router")
    router_policy: RouterPolicy = "manual"
    router_assignment_mode: Literal["random", "min_load", "min_group"] = "min_load"
    router_balance_abs_threshold: int = 10  # slime's default; cache_aware only

    def __post_init__(self) -> None:
        require(
            0 < self.mem_fraction_static < 1,
            "slime.sglang.mem_fraction_static",
            "in (0, 1)",
            self.mem_fraction_static,
        )
        require(
            self.router_balance_abs_threshold >= 0,
            "slime.sglang.router_balance_abs_threshold",
            "0 or more",
            self.router_balance_abs_threshold,
        )


@dataclass(frozen=True)
class SlimeFaultTolerance:
    enabled: bool = False  # --use-fault-tolerance: SGLang engines health-checked, restarted
    first_wait_s: int = 300  # --rollout-health-check-first-wait (must be > 0 with it on)

    def __post_init__(self) -> None:
        require(
            not self.enabled or self.first_wait_s > 0,
            "slime.fault_tolerance.first_wait_s",
            "> 0 with fault tolerance on (engines need time to load)",
            self.first_wait_s,
        )


@dataclass(frozen=True)
class SlimeEval:
    sets: dict[str, str] = field(default_factory=dict)  # name -> JSONL (--eval-prompt-data)
    n_samples_per_eval_prompt: int = 1
    interval: int = 0  # rollouts between evaluations; 0 = no evaluation

    def __post_init__(self) -> None:
        require(
            not self.interval or bool(self.sets),
            "slime.eval.interval",
            "0 unless slime.eval.sets names at least one set",
            self.interval,
        )


AttentionBackend = Literal["flash", "fused", "unfused", "local", "auto", ""]


@dataclass(frozen=True)
class SlimeMisc:
    """What every slime run script passes as MISC_ARGS (scripts/run-*.sh at 624b824): Megatron's
    dropout defaults to 0.1, which RL fine-tuning does not want; fp32 gradient accumulation and
    softmax "should be good for model performance"; flash attention (22 of its 23 run scripts
    pass it; a comment says to drop it for MLA, which its Moonlight script does and its
    DeepSeek and Kimi ones do not: "" leaves the flag out)."""

    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    accumulate_allreduce_grads_in_fp32: bool = True
    attention_softmax_in_fp32: bool = True
    attention_backend: AttentionBackend = "flash"

    def __post_init__(self) -> None:
        for name in ("attention_dropout", "hidden_dropout"):
            value = getattr(self, name)
            require(0 <= value < 1, f"slime.misc.{name}", "in [0, 1)", value)


@dataclass(frozen=True)
class SlimeDeepDive(RolloutKnobs):
    """Our rollout's knobs (deepdive.rollout_settings.RolloutKnobs: the keys, the defaults and
    why), in the --custom-config-path YAML."""

    KEYS: ClassVar[str] = "slime.deepdive."


@dataclass(frozen=True)
class SlimeSection:
    slime_root: str = "/opt/slime"  # where train.py is (the training image, containers/train.def)
    python_path: list[str] = field(default_factory=lambda: ["/opt/slime", "/opt/Megatron-LM"])
    socket_ifname: str = ""  # GLOO/NCCL_SOCKET_IFNAME; "" = the one holding the node address
    model: SlimeModel = field(default_factory=SlimeModel)
    checkpoint: SlimeCheckpoint = field(default_factory=SlimeCheckpoint)
    parallelism: SlimeParallelism = field(default_factory=SlimeParallelism)
    resources: SlimeResources = field(default_factory=SlimeResources)
    rollout: SlimeRollout = field(default_factory=SlimeRollout)
    algorithm: SlimeAlgorithm = field(default_factory=SlimeAlgorithm)
    optimizer: SlimeOptimizer = field(default_factory=SlimeOptimizer)
    sglang: SlimeSGLang = field(default_factory=SlimeSGLang)
    misc: SlimeMisc = field(default_factory=SlimeMisc)
    fault_tolerance: SlimeFaultTolerance = field(default_factory=SlimeFaultTolerance)
    eval: SlimeEval = field(default_factory=SlimeEval)
    deepdive: SlimeDeepDive = field(default_factory=SlimeDeepDive)
    extra_args: list[str] = field(default_factory=list)


def max_tokens_per_gpu(slime: SlimeSection) -> int:
    """The dynamic batch's cap: the configured one, else one longest episode per GPU over CP
    (slime's --max-tokens-per-gpu help: "around max_response_len // cp_size")."""
    parallel = slime.parallelism
    return parallel.max_tokens_per_gpu or -(-slime.rollout.max_context_len // parallel.context)
