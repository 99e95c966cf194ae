"""From an experiment to slime's command line: a function of the config (golden-tested,
printed by --dry-run; with log_probs_chunk_size = -1 it reads the model's config.json too), grouped as slime's own launch scripts group their flags; and, apart
from it, the --custom-config-path YAML that carries our rollout's keys onto slime's `args`
(slime/utils/arguments.py, lines 2013-2019: every key of that file is set on `args`), with
where the rollout log functions record episodes (RUN/trajectories, on shared storage:
slime calls them in its rollout process, on whichever node holds it). The
argv names only the YAML's path, so it is built without any URL; the YAML needs the cluster's
services (every node's URLs), known only once every node is ready.

The hooks are always ours: --custom-generate-function-path and --custom-rm-path (the reward
server's batch endpoint with aliases and the episode's flags; slime's remote_rm would lose
them), the rollout log functions that count aborted episodes (deepdive.aborts), the group
normalisation over the episodes SGLang answered (deepdive.group_rewards), and
slime's data source behind the check that refuses a rollout the hook cannot run under
(deepdive.rollout_modes). --group-rm is never emitted: slime's evaluation asserts against it. Checkpoints are
the run folder's: --save and --load the same folder, so a requeued job continues from the
newest complete checkpoint (Megatron writes latest_checkpointed_iteration.txt last; without
one, slime starts from --ref-load, slime/utils/arguments.py, lines 1817-1834).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deepdive.rollout_modes import DATA_SOURCE_PATH
from deepdive.rollout_settings import (
    EVAL_LOG_FUNCTION_PATH,
    GENERATE_FUNCTION_PATH,
    REWARD_FUNCTION_PATH,
    REWARD_POST_PROCESS_PATH,
    ROLLOUT_LOG_FUNCTION_PATH,
    slime_custom_config,
)
from deepdive.service_urls import Nodes
from services.base.errors import ConfigError
from slurm.backends.slime import DATA_PACKAGE
from slurm.backends.slime.config import SlimeSection, max_tokens_per_gpu
from slurm.backends.slime.memory_estimate import log_probs_chunk_size
from slurm.backends.slime.model_context import read_config
from slurm.config import ExperimentConfig
from slurm.package_data import read_json

# what slime's 32B examples pass to keep Adam's states in CPU memory (scripts/run-qwen3-32B.sh;
# Megatron asserts the precision-aware optimizer with it, megatron/training/arguments.py:1189)
OPTIMIZER_CPU_OFFLOAD = [
    "--optimizer-cpu-offload",
    "--overlap-cpu-optimizer-d2h-h2d",
    "--use-precision-aware-optimizer",
]
FILTERS = "deepdive.filters"
# (drop groups whose rewards are all equal, drop groups where every sample failed) -> filter
DYNAMIC_FILTERS = {
    (True, False): "drop_uniform_groups",
    (False, True): "drop_failed_groups",
    (True, True): "drop_uniform_or_failed_groups",
}
PRESETS = "presets.json"  # in this package (slurm/package_data.py reads it)
CUSTOM_CONFIG_FLAG = "--custom-config-path"  # the YAML of our rollout's keys
HOOK_PACKAGE = "deepdive"  # a flag whose value is a path into it names one of our hooks
EXTRA_GROUP = "EXTRA_ARGS"  # slime.extra_args, last: argparse keeps a flag's last value


@dataclass(frozen=True)
class SlimeCommand:
    groups: list[tuple[str, list[str]]]  # (the group's name, its arguments)

    def arguments(self) -> list[str]:
        return [item for _, items in self.groups for item in items]

    def flags(self) -> list[str]:
        return [item for item in self.arguments() if item.startswith("--")]


# what node 0 runs in slime's root: train.py's main, with the warning's save (driver.py)
DRIVER_MODULE = "slurm.backends.slime.driver"


def presets() -> dict[str, Any]:
    return dict(read_json(DATA_PACKAGE, PRESETS)["presets"])


def architecture(slime: SlimeSection) -> list[str]:
    """The model's Megatron architecture arguments: a preset's, or the config's own."""
    if slime.model.architecture:
        return list(slime.model.architecture)
    return list(presets()[slime.model.preset]["args"])


def _number(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _switch(flag: str, on: bool) -> list[str]:
    return [flag] if on else []


def sglang_context_length(slime: SlimeSection) -> int:
    """The context SGLang serves: the configured one, else exactly the episode's budget."""
    return slime.sglang.context_length or slime.rollout.max_context_len


def chosen_chunk_size(config: ExperimentConfig) -> int:
    """--log-probs-chunk-size: the configured one, or the memory estimate's choice, which reads
    the model's config.json (0, not passed, when there is none yet)."""
    path = Path(config.slime.model.hf_checkpoint) / "config.json"
    try:
        model = read_config(path.parent) if path.is_file() else None
    except ConfigError:
        model = None  # the checks name an unreadable config.json
    return log_probs_chunk_size(config, model)


def router_arguments(slime: SlimeSection) -> list[str]:
    """How slime's router keeps an episode's turns on one engine (its KV prefix cache), per
    policy, read from sglang-router 0.3.2 (docs/slime.md, "The router"): "manual" routes by our
    X-SMG-Routing-Key header and takes its assignment mode; "cache_aware" ignores the header and
    takes the balance threshold (0 would send every turn to the shortest queue); the others
    take neither."""
    sglang = slime.sglang
    arguments = ["--router-policy", sglang.router_policy]
    if sglang.router_policy == "manual":
        arguments += ["--router-assignment-mode", sglang.router_assignment_mode]
    if sglang.router_policy == "cache_aware":
        arguments += ["--router-balance-abs-threshold", str(sglang.router_balance_abs_threshold)]
    return arguments


def slime_checkpoints(config: ExperimentConfig) -> Path:
    return config.run_folder.root / "slime_checkpoints"


def slime_arguments(config: ExperimentConfig, custom_config_path: Path) -> SlimeCommand:
    """slime's argument list, which reads our rollout's keys from `custom_config_path` (the
    YAML `custom_config` makes)."""
    slime = config.slime
    model, rollout, algorithm = slime.model, slime.rollout, slime.algorithm
    optimizer, sglang, parallel = slime.optimizer, slime.sglang, slime.parallelism
    resources = slime.resources
    checkpoints = str(slime_checkpoints(config))
    groups: list[tuple[str, list[str]]] = []
    groups.append(
        (
            "RESOURCES",
            [
                "--actor-num-nodes", str(resources.actor_num_nodes),
                "--actor-num-gpus-per-node", str(resources.actor_num_gpus_per_node),
                "--rollout-num-gpus", str(resources.rollout_num_gpus),
                "--rollout-num-gpus-per-engine", str(resources.rollout_num_gpus_per_engine),
                # slime places SGLang engines by it (default 8: a 4-GPU node breaks;
                # slime/backends/sglang_utils/sglang_engine.py, lines 22-27)
                "--num-gpus-per-node", str(config.slurm.gpus_per_node),
                *_switch("--colocate", resources.colocate),
                *_switch("--offload", resources.offload),
            ],
        )
    )  # fmt: skip
    groups.append(
        (
            "MODEL_ARGS",
            [
                *architecture(slime),
                "--max-position-embeddings", str(rollout.max_context_len),
                "--seq-length", str(rollout.max_context_len),
                "--tokenizer-type", "HuggingFaceTokenizer",
                "--tokenizer-model", model.hf_checkpoint,
            ],
        )
    )  # fmt: skip
    ckpt = ["--hf-checkpoint", model.hf_checkpoint]
    if model.ref_load:
        ckpt += ["--ref-load", model.ref_load]
    ckpt += ["--save", checkpoints, "--load", checkpoints]
    ckpt += ["--save-interval", str(slime.checkpoint.save_interval), "--ckpt-format", "torch_dist"]
    groups.append(("CKPT_ARGS", ckpt))
    rollout_args = [
        "--custom-generate-function-path", GENERATE_FUNCTION_PATH,
        "--custom-rm-path", REWARD_FUNCTION_PATH,
        "--custom-rollout-log-function-path", ROLLOUT_LOG_FUNCTION_PATH,
        "--custom-eval-rollout-log-function-path", EVAL_LOG_FUNCTION_PATH,
        "--custom-reward-post-process-path", REWARD_POST_PROCESS_PATH,
        "--data-source-path", DATA_SOURCE_PATH,
        CUSTOM_CONFIG_FLAG, str(custom_config_path),
        "--prompt-data", rollout.prompt_data,
        "--input-key", rollout.input_key,
        "--label-key", rollout.label_key,
        "--tool-key", rollout.tool_key,
        "--metadata-key", rollout.metadata_key,
        *_switch("--apply-chat-template", rollout.apply_chat_template),
        *_switch("--rollout-shuffle", rollout.shuffle),
        "--rollout-batch-size", str(rollout.rollout_batch_size),
        "--n-samples-per-prompt", str(rollout.n_samples_per_prompt),
        "--global-batch-size", str(rollout.global_batch_size),
        "--num-steps-per-rollout", str(rollout.num_steps_per_rollout),
        "--num-rollout", str(rollout.num_rollout),
        "--rollout-max-context-len", str(rollout.max_context_len),
        "--rollout-max-response-len", str(rollout.max_response_len),
        "--rollout-temperature", _number(rollout.temperature),
        "--rollout-top-p", _number(rollout.top_p),
    ]  # fmt: skip
    if rollout.over_sampling_batch_size:
        rollout_args += ["--over-sampling-batch-size", str(rollout.over_sampling_batch_size)]
    dynamic_filter = DYNAMIC_FILTERS.get((rollout.drop_uniform_groups, rollout.drop_failed_groups))
    if dynamic_filter:
        rollout_args += ["--dynamic-sampling-filter-path", f"{FILTERS}.{dynamic_filter}"]
    groups.append(("ROLLOUT_ARGS", rollout_args))
    if slime.eval.sets:
        evaluation = ["--eval-prompt-data"]
        for name, path in sorted(slime.eval.sets.items()):
            evaluation += [name, path]
        evaluation += ["--n-samples-per-eval-prompt", str(slime.eval.n_samples_per_eval_prompt)]
        if slime.eval.interval:
            evaluation += ["--eval-interval", str(slime.eval.interval)]
        groups.append(("EVAL_ARGS", evaluation))
    perf = [
        "--tensor-model-parallel-size", str(parallel.tensor),
        "--pipeline-model-parallel-size", str(parallel.pipeline),
        "--context-parallel-size", str(parallel.context),
        "--expert-model-parallel-size", str(parallel.expert),
        "--expert-tensor-parallel-size", str(parallel.expert_tensor),
        *_switch("--sequence-parallel", parallel.sequence_parallel),
    ]  # fmt: skip
    if parallel.recompute_granularity:
        perf += ["--recompute-granularity", parallel.recompute_granularity]
    if parallel.recompute_method:
        perf += ["--recompute-method", parallel.recompute_method]
    if parallel.recompute_num_layers:
        perf += ["--recompute-num-layers", str(parallel.recompute_num_layers)]
    if parallel.use_dynamic_batch_size:
        perf += ["--use-dynamic-batch-size", "--max-tokens-per-gpu", str(max_tokens_per_gpu(slime))]
    chunk = chosen_chunk_size(config)
    if chunk:
        perf += ["--log-probs-chunk-size", str(chunk)]
    groups.append(("PERF_ARGS", perf))
    grpo = ["--advantage-estimator", algorithm.advantage_estimator]
    if algorithm.use_kl_loss:
        grpo += ["--use-kl-loss", "--kl-loss-type", algorithm.kl_loss_type]
        grpo += ["--kl-loss-coef", _number(algorithm.kl_loss_coef)]
    grpo += [
        "--kl-coef", _number(algorithm.kl_coef),
        "--entropy-coef", _number(algorithm.entropy_coef),
        "--eps-clip", _number(algorithm.eps_clip),
        "--eps-clip-high", _number(algorithm.eps_clip_high),
        *_switch("--calculate-per-token-loss", algorithm.calculate_per_token_loss),
    ]  # fmt: skip
    groups.append(("GRPO_ARGS", grpo))
    groups.append(
        (
            "OPTIMIZER_ARGS",
            [
                "--optimizer", "adam",
                "--lr", _number(optimizer.lr),
                "--lr-decay-style", optimizer.lr_decay_style,
                "--lr-warmup-iters", str(optimizer.lr_warmup_iters),
                "--weight-decay", _number(optimizer.weight_decay),
                "--adam-beta1", _number(optimizer.adam_beta1),
                "--adam-beta2", _number(optimizer.adam_beta2),
                *(OPTIMIZER_CPU_OFFLOAD if optimizer.cpu_offload else []),
            ],
        )
    )  # fmt: skip
    sglang_args = [
        "--sglang-mem-fraction-static", _number(sglang.mem_fraction_static),
        "--sglang-log-level", sglang.log_level,
        "--sglang-router-request-timeout-secs", str(sglang.router_request_timeout_secs),
        *router_arguments(slime),
        "--sglang-context-length", str(sglang_context_length(slime)),
    ]  # fmt: skip
    groups.append(("SGLANG_ARGS", sglang_args))
    misc = slime.misc
    misc_args = [
        "--attention-dropout", _number(misc.attention_dropout),
        "--hidden-dropout", _number(misc.hidden_dropout),
        *_switch("--accumulate-allreduce-grads-in-fp32", misc.accumulate_allreduce_grads_in_fp32),
        *_switch("--attention-softmax-in-fp32", misc.attention_softmax_in_fp32),
    ]  # fmt: skip
    if misc.attention_backend:
        misc_args += ["--attention-backend", misc.attention_backend]
    groups.append(("MISC_ARGS", misc_args))
    if slime.fault_tolerance.enabled:
        groups.append(
            (
                "FAULT_TOLERANCE_ARGS",
                [
                    "--use-fault-tolerance",
                    "--rollout-health-check-first-wait",
                    str(slime.fault_tolerance.first_wait_s),
                ],
            )
        )
    # TensorBoard events (the directory: TENSORBOARD_DIR, set by the backend) for `deepdive status`
    groups.append(("LOGGING_ARGS", ["--use-tensorboard"]))
    if slime.extra_args:
        groups.append((EXTRA_GROUP, list(slime.extra_args)))
    return SlimeCommand(groups)


def custom_config(
    config: ExperimentConfig, tools: Nodes, reward: tuple[str, ...]
) -> dict[str, Any]:
    """The --custom-config-path YAML: our rollout's keys as slime sets them on `args`
    (deepdive.rollout_settings) with the URLs the rollout reaches every node's tool server
    workers (`tools`, node by node) and reward servers at, as lists; SGLang is slime's
    router, the rollout's default."""
    slime = config.slime
    return slime_custom_config(
        slime.deepdive,
        slime.rollout.max_context_len,
        tools,
        reward,
        str(config.run_folder.trajectories),
    )


def render(command: SlimeCommand, slime_root: str) -> str:
    """The command line as slime's own scripts write it: a bash array per group, then
    train.py (through our driver, slurm/backends/slime/driver.py, in slime's root) with all of
    them (a shell runs it as it stands)."""
    lines = []
    for name, items in command.groups:
        lines.append(f"{name}=(")
        line = "  "
        for item in items:
            token = shlex.quote(item)
            if item.startswith("--") and len(line) + len(token) > 94 and line.strip():
                lines.append(line)
                line = "  "
            line += " " + token
        lines += [line, ")"]
    groups = " ".join(f'"${{{name}[@]}}"' for name, _ in command.groups)
    driver = f"python3 -m {DRIVER_MODULE}"
    lines.append(f"cd {shlex.quote(slime_root)} && {driver} {groups}")
    return "\n".join(lines)
