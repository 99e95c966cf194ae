"""What is checked before a slime job is submitted (and a GPU allocated), each error naming the
config key and what was expected:

- every flag the argument builder emits, and every flag in `slime.extra_args`, exists at the
  pinned commits (slurm/backends/slime/flags.json: slime silently ignores a flag it does not know);
- the whole argv parses as slime's own parsers parse it (slurm/backends/slime/replay.py, rebuilt from
  the pin-time record): every value of the type and among the choices slime accepts, no token
  that no parser takes;
- the batch identity slime asserts: rollout_batch_size x n_samples_per_prompt =
  global_batch_size x num_steps_per_rollout;
- the GPUs add up: actor nodes x GPUs per node plus rollout GPUs fit in the job (unless
  colocated, when the rollout uses the actor's GPUs);
- tensor parallelism divides the attention heads and the query groups;
- the preset (or the architecture arguments) matches the model's config.json: hidden size,
  layers, heads, KV heads, vocabulary, FFN size, rope theta;
- no pair slime cannot run with our hooks: --group-rm with evaluation sets, --partial-rollout,
  the fully-async rollout, an `extra_args` flag that would replace one of our hooks or the
  --custom-config-path YAML; services every node's rollout can reach when the job has more than
  one node;
- every episode fits the context SGLang serves: max_context_len and the response budget
  against config.json and --sglang-context-length (slurm/backends/slime/model_context.py), so no turn is
  refused and ABORTED.

Two estimates warn instead of refusing, with the arithmetic (slurm/backends/slime/memory_estimate.py):
a training GPU's memory (weights, gradients, Adam's states, activations, logits, log-softmax)
against slime.resources.gpu_memory_mib, and a node's host memory (CPU Adam, slime's weight
backups) against the node's (host_memory_warnings: the node's figure is read from Slurm by the
backend). check_slime returns the first for the caller to print.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, NoReturn

from deepdive.rollout_modes import DATA_SOURCE_PATH, fully_async
from deepdive.rollout_settings import GENERATE_FUNCTION_PATH
from services.base.errors import ConfigError
from slurm.backends.slime import DATA_PACKAGE
from slurm.backends.slime.args import (
    CUSTOM_CONFIG_FLAG,
    EXTRA_GROUP,
    HOOK_PACKAGE,
    SlimeCommand,
    architecture,
    presets,
    slime_arguments,
)
from slurm.backends.slime.memory_estimate import estimate, host_estimate
from slurm.backends.slime.model_context import (
    check_episode_fits,
    check_trainer_rope,
    model_context,
    read_config,
    served_context,
)
from slurm.backends.slime.replay import replay
from slurm.config import INPUT_FILES, ExperimentConfig
from slurm.package_data import read_json

FLAGS = "flags.json"  # in this package (slurm/package_data.py reads it)
# a model's config.json key -> the Megatron flag that must say the same
CONFIG_KEYS = {
    "num_hidden_layers": "--num-layers",
    "hidden_size": "--hidden-size",
    "intermediate_size": "--ffn-hidden-size",
    "num_attention_heads": "--num-attention-heads",
    "num_key_value_heads": "--num-query-groups",
    "vocab_size": "--vocab-size",
    "rope_theta": "--rotary-base",
    "rms_norm_eps": "--norm-epsilon",  # slime compares these too (megatron_utils/arguments.py:126)
}
REFUSED = {
    "--group-rm": "slime's evaluation asserts against group RM, and reward_func already "
    "batches each group (slime/rollout/sglang_rollout.py, lines 477 and 499)",
    "--partial-rollout": f"{GENERATE_FUNCTION_PATH} cannot continue an aborted multi-turn episode",
}


@cache
def slime_flags() -> dict[str, list[str]]:
    return dict(read_json(DATA_PACKAGE, FLAGS)["flags"])


def flag_sources() -> dict[str, Any]:
    return dict(read_json(DATA_PACKAGE, FLAGS)["sources"])


def _fail(key: str, message: str) -> NoReturn:
    raise ConfigError(f"{key}: {message}")


def check_slime(config: ExperimentConfig) -> list[str]:
    """Refuse what cannot run (a ConfigError naming the key); return the warnings."""
    slime = config.slime
    _check_required(config)
    _check_extra_args(slime.extra_args)
    emitted = slime_arguments(config, Path("/run/deepdive.yaml"))
    _check_rollout_function(emitted.arguments())
    _check_hooks_kept(emitted)
    known = slime_flags()
    for flag in emitted.flags():
        if flag not in known:  # a bug of the builder: said so, with where the list comes from
            _fail("slime", f"the builder emits {flag}, which slime does not know at {_pins()}")
    parsed = replay(emitted.arguments())  # a value slime's parsers refuse: a ConfigError
    if parsed.ignored:
        _fail(
            "slime.extra_args",
            f"{' '.join(parsed.ignored)}: none of slime's parsers takes it (slime would drop "
            "it without a word)",
        )
    rollout = slime.rollout
    samples = rollout.rollout_batch_size * rollout.n_samples_per_prompt
    steps = rollout.global_batch_size * rollout.num_steps_per_rollout
    if samples != steps:
        _fail(
            "slime.rollout.global_batch_size",
            f"rollout_batch_size x n_samples_per_prompt ({rollout.rollout_batch_size} x "
            f"{rollout.n_samples_per_prompt} = {samples}) must equal global_batch_size x "
            f"num_steps_per_rollout ({rollout.global_batch_size} x "
            f"{rollout.num_steps_per_rollout} = {steps})",
        )
    _check_gpus(config)
    args = _arguments(architecture(slime))
    heads = int(args.get("--num-attention-heads", "0") or 0)
    groups = int(args.get("--num-query-groups", heads) or heads)
    tensor = slime.parallelism.tensor
    for name, count in (("attention heads", heads), ("query groups", groups)):
        if count and count % tensor:
            _fail(
                "slime.parallelism.tensor",
                f"{tensor} does not divide the model's {count} {name}",
            )
    hf: dict[str, Any] | None = None
    if (Path(slime.model.hf_checkpoint) / "config.json").is_file():
        hf = _read_model_config(config)
        _check_model_config(config, args, hf)
        _check_context(config, args, hf)
    if slime.eval.sets and "--group-rm" in slime.extra_args:
        _fail("slime.extra_args", f"--group-rm with slime.eval.sets: {REFUSED['--group-rm']}")
    if config.slurm.nodes > 1 and config.services.host in ("127.0.0.1", "localhost", "::1"):
        _fail(
            "services.host",
            'an address the other nodes reach (e.g. "node", with DEEPDIVE_SERVICE_TOKEN in '
            "the env file): slime's rollout may run on any node and calls node 0's services",
        )
    if hf is None:  # slurm.launch.preflight lists the missing model; a real submit refuses it
        return [
            f"not checked against the model (no {slime.model.hf_checkpoint}/config.json yet): "
            "the preset's shape, the context SGLang serves, the memory estimate"
        ]
    return _memory_warnings(config, hf)


def _read_model_config(config: ExperimentConfig) -> dict[str, Any]:
    try:
        return read_config(config.slime.model.hf_checkpoint)
    except ConfigError as error:
        _fail("slime.model.hf_checkpoint", error.message)


def _check_context(config: ExperimentConfig, args: dict[str, str], hf: dict[str, Any]) -> None:
    """Every turn of every episode is a request SGLang serves (slurm/backends/slime/model_context.py)."""
    slime = config.slime
    model = model_context(hf, str(Path(slime.model.hf_checkpoint) / "config.json"))
    # the configured one (0: SGLang derives it); the argv then passes max_context_len
    served = served_context(model, slime.sglang.context_length, "slime.sglang.context_length")
    check_episode_fits(
        model,
        served,
        slime.rollout.max_context_len,
        slime.rollout.max_response_len,
        "slime.rollout.max_context_len",
        "slime.rollout.max_response_len",
    )
    check_trainer_rope(model, multi_latent_attention="--multi-latent-attention" in args)


def _memory_warnings(config: ExperimentConfig, hf: dict[str, Any]) -> list[str]:
    found = estimate(config, hf)
    if found is None or found.fits():
        return []
    return [
        f"a training GPU may run out of memory: about {found.total_gib:.0f} GiB needed, "
        f"slime.resources.gpu_memory_mib = {config.slime.resources.gpu_memory_mib} "
        f"({found.budget_gib:.1f} GiB)\n{found.describe()}\n"
        "  (recompute, dynamic batching with a smaller max_tokens_per_gpu, optimizer "
        'cpu_offload or more tensor parallelism lower it; docs/slime.md, "Memory estimate")'
    ]


def host_memory_warnings(
    config: ExperimentConfig, node_memory: tuple[float, str] | None
) -> list[str]:
    """One node's host memory against the node's (GiB, and where that figure came from: the
    experiment's slurm.mem_gb, Slurm's RealMemory of the nodes, the smoke kit's MemTotal)."""
    model = Path(config.slime.model.hf_checkpoint) / "config.json"
    if not model.is_file():
        return []  # check_slime says the model was not checked
    if node_memory is None:
        return [
            "a node's host memory was not checked: slurm.mem_gb = 0 and Slurm did not say "
            "how much memory the nodes have (`deepdive smoke` step 1 checks it on a node)"
        ]
    node_gib, source = node_memory
    found = host_estimate(config, _read_model_config(config), node_gib)
    if found is None or found.fits():
        return []
    return [
        f"a node may run out of host memory: about {found.total_gib:.0f} GiB needed, the node "
        f"has {node_gib:.0f} GiB ({source})\n{found.describe()}\n"
        "  (fewer actor GPUs per node, no KL reference, optimizer cpu_offload off, or nodes "
        'with more memory lower it; docs/slime.md, "Memory estimate")'
    ]


def _pins() -> str:
    sources = flag_sources()
    return (
        f"slime {sources['slime']['commit']}, Megatron-LM {sources['megatron']['commit'][:9]}, "
        f"SGLang {sources['sglang']['version']}, sglang-router {sources['router']['version']}"
    )


def _check_required(config: ExperimentConfig) -> None:
    model, rollout = config.slime.model, config.slime.rollout
    if not model.preset and not model.architecture:
        _fail("slime.model.preset", f"one of: {', '.join(sorted(presets()))} (or architecture)")
    if model.preset and model.preset not in presets():
        _fail(
            "slime.model.preset",
            f"one of: {', '.join(sorted(presets()))}; got {model.preset!r}",
        )
    if not model.hf_checkpoint:
        _fail("slime.model.hf_checkpoint", "a Hugging Face model folder (with config.json)")
    if (
        config.slime.algorithm.use_kl_loss or config.slime.algorithm.kl_coef
    ) and not model.ref_load:
        _fail("slime.model.ref_load", "the reference torch_dist checkpoint (KL needs one)")
    if not rollout.prompt_data:
        _fail("slime.rollout.prompt_data", "a JSONL file of prompts (deepdive convert)")
    # that they exist is slurm.launch.preflight's: a dry run goes on without them
    if config.slurm.gpus_per_node < 1:
        _fail("slurm.gpus_per_node", "at least 1 for the slime backend")


def _check_extra_args(extra: list[str]) -> None:
    known = slime_flags()
    for index, item in enumerate(extra):
        if not item.startswith("--"):
            continue
        flag = item.split("=", 1)[0]
        if flag not in known:
            close = sorted(f for f in known if flag.removeprefix("--sglang-") in f)[:3]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            _fail("slime.extra_args", f"{flag} is not a flag of slime at {_pins()}{hint}")
        if flag in REFUSED:
            _fail("slime.extra_args", f"{flag}: {REFUSED[flag]}")
        kind = known[flag][1]
        following = extra[index + 1] if index + 1 < len(extra) else None
        if (
            kind == "value"
            and "=" not in item
            and (following is None or following.startswith("--"))
        ):
            _fail("slime.extra_args", f"{flag} takes a value")


def _check_rollout_function(arguments: list[str]) -> None:
    """The rollout function slime will run, read from the whole command line as argparse
    reads it (the last value wins, `--flag value` or `--flag=value`): never the fully-async
    rollout, whose worker thread logs the hook's refusal and waits on (deepdive.rollout_modes);
    and slime's data source stays ours, the check that refuses it again at start-up."""
    values: dict[str, str] = {}
    for index, item in enumerate(arguments):
        flag, equals, value = item.partition("=")
        if flag in ("--rollout-function-path", "--data-source-path"):
            following = arguments[index + 1] if index + 1 < len(arguments) else ""
            values[flag] = value if equals else following
    rollout = values.get("--rollout-function-path", "")
    if fully_async(rollout):
        _fail(
            "slime.extra_args",
            f"--rollout-function-path {rollout}: the fully-async rollout continues aborted "
            f"episodes, which {GENERATE_FUNCTION_PATH} cannot, and its worker thread only logs the "
            "hook's refusal, so the run would wait until its time limit; use slime's default",
        )
    if values.get("--data-source-path", DATA_SOURCE_PATH) != DATA_SOURCE_PATH:
        _fail(
            "slime.extra_args",
            f"--data-source-path {values['--data-source-path']}: the launcher passes "
            f"{DATA_SOURCE_PATH} (slime's own data source, behind the check that refuses a "
            "rollout the hook cannot run under)",
        )


def _check_hooks_kept(emitted: SlimeCommand) -> None:
    """No `extra_args` flag may name one of our hooks (a flag the builder gives a path to our
    code: --custom-generate-function-path, --custom-rollout-log-function-path, ...) or the
    --custom-config-path YAML: argparse keeps a flag's last value, and EXTRA_ARGS come last, so
    it would silently replace the hook (a --custom-rollout-log-function-path there removes the
    abort stop) or the YAML that carries every node's service URLs."""
    ours: dict[str, str] = {}
    extra: list[str] = []
    for name, items in emitted.groups:
        if name == EXTRA_GROUP:
            extra = items
            continue
        for index, item in enumerate(items[:-1]):
            value = items[index + 1]
            if item == CUSTOM_CONFIG_FLAG or (
                item.startswith("--") and value.startswith(f"{HOOK_PACKAGE}.")
            ):
                ours[item] = value
    for item in extra:
        flag = item.split("=", 1)[0]
        if flag in ours:
            _fail(
                "slime.extra_args",
                f"{flag}: the launcher sets it ({ours[flag]}); a second value would replace "
                "it (argparse keeps the last), and with it "
                + ("every node's service URLs" if flag == CUSTOM_CONFIG_FLAG else "our hook"),
            )


def _check_gpus(config: ExperimentConfig) -> None:
    resources, slurm = config.slime.resources, config.slurm
    if resources.actor_num_nodes > slurm.nodes:
        _fail(
            "slime.resources.actor_num_nodes",
            f"at most slurm.nodes ({slurm.nodes}); got {resources.actor_num_nodes}",
        )
    if resources.actor_num_gpus_per_node > slurm.gpus_per_node:
        _fail(
            "slime.resources.actor_num_gpus_per_node",
            f"at most slurm.gpus_per_node ({slurm.gpus_per_node})",
        )
    actor = resources.actor_num_nodes * resources.actor_num_gpus_per_node
    total = slurm.nodes * slurm.gpus_per_node
    rollout = 0 if resources.colocate else resources.rollout_num_gpus
    if actor + rollout > total:
        _fail(
            "slime.resources.rollout_num_gpus",
            f"actor ({actor}) + rollout ({resources.rollout_num_gpus}) GPUs must fit the job's "
            f"{total} ({slurm.nodes} nodes x {slurm.gpus_per_node}), or set colocate = true",
        )
    used = -(-(actor + rollout) // slurm.gpus_per_node)  # whole nodes, rounded up
    shares = (
        f"actor {actor}, the rollout on the same GPUs"
        if resources.colocate
        else f"actor {actor} + rollout {rollout}"
    )
    if used < slurm.nodes:
        _fail(
            "slurm.nodes",
            f"{slurm.nodes} nodes, but slime uses {actor + rollout} GPUs ({shares}) = {used} "
            f"node(s) of {slurm.gpus_per_node}: {slurm.nodes - used} would sit idle; ask for "
            f"{used} (or give slime.resources the other nodes)",
        )


def _arguments(items: list[str]) -> dict[str, str]:
    """Flag -> its value ("" for a switch)."""
    found: dict[str, str] = {}
    for index, item in enumerate(items):
        if item.startswith("--"):
            following = items[index + 1] if index + 1 < len(items) else ""
            found[item] = "" if following.startswith("--") else following
    return found


def _check_model_config(config: ExperimentConfig, args: dict[str, str], hf: dict[str, Any]) -> None:
    path = Path(config.slime.model.hf_checkpoint) / "config.json"
    hf = {**hf.get("text_config", {}), **hf}
    if "rope_theta" not in hf:
        hf["rope_theta"] = (hf.get("rope_parameters") or {}).get("rope_theta")
    if "--group-query-attention" not in args:
        args = {**args, "--num-query-groups": args.get("--num-attention-heads", "")}
    wrong = []
    for key, flag in CONFIG_KEYS.items():
        ours, theirs = args.get(flag), hf.get(key)
        if ours in (None, "") or theirs is None:
            continue
        if float(ours) != float(theirs):
            wrong.append(f"{key} {theirs} != {flag} {ours}")
    if wrong:
        where = (
            f"slime.model.preset {config.slime.model.preset!r}"
            if config.slime.model.preset
            else "slime.model.architecture"
        )
        _fail(
            "slime.model.preset" if config.slime.model.preset else "slime.model.architecture",
            f"{where} does not match {path}: {'; '.join(wrong)}",
        )


def source_checkout() -> Path | None:
    """The git checkout this launcher runs from (None when it is installed: a wheel, the
    image)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / ".git").exists() and (root / "pyproject.toml").is_file() else None


def missing_inputs(config: ExperimentConfig) -> list[str]:
    """What the slime job reads that is not on disk yet (slurm.launch.preflight lists them: a dry run
    goes on without them, a real submission refuses)."""
    model, rollout = config.slime.model, config.slime.rollout
    missing = []
    checkout = source_checkout()
    folder = Path(config.run.folder).resolve()
    if checkout is not None and (folder == checkout or checkout in folder.parents):
        missing.append(
            f"run.folder: {config.run.folder} is inside the launcher's checkout ({checkout}): "
            "slime's checkpoints (hundreds of GB each for a 32B model) belong on shared "
            "storage every node sees; set run.folder there"
        )
    if model.hf_checkpoint and not (Path(model.hf_checkpoint) / "config.json").is_file():
        missing.append(
            f"slime.model.hf_checkpoint: {model.hf_checkpoint} has no config.json "
            "(a Hugging Face model folder)"
        )
    if model.ref_load and not Path(model.ref_load).is_dir():
        missing.append(
            f"slime.model.ref_load: {model.ref_load} is not a folder (a torch_dist checkpoint: "
            "deepdive convert-checkpoint to-megatron makes it)"
        )
    if rollout.prompt_data and not Path(rollout.prompt_data).is_file():
        missing.append(
            f"slime.rollout.prompt_data: {rollout.prompt_data}: no such file (deepdive convert)"
        )
    for name, path in sorted(config.slime.eval.sets.items()):
        if not Path(path).is_file():
            missing.append(f"slime.eval.sets.{name}: {path}: no such file")
    for key in INPUT_FILES:  # what the tool server every node runs reads
        named = config.services.tools.get(key)
        if isinstance(named, str) and not Path(named).is_file():
            missing.append(f"services.tools.{key}: {named}: no such file")
    return missing
