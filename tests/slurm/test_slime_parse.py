"""slime's own parse_args accepts the argv the launcher builds, and reads from it the values the
TOML meant. slime cannot be installed in CI, so two records taken where it imports stand in:

- golden/slime_parse.json (scripts/slime_parse.py): for every config in configs/ with backend
  "slime", the argv and what slime's own parsers made of it at 624b824 (and that its whole
  parse_args, validation included, accepted it);
- slurm/backends/slime/flags.json "parsers" (scripts/slime_flags.py): slime's four parsers, which
  slurm/backends/slime/replay.py rebuilds, so any argv (every variant of a config) is parsed here as
  slime would parse it. The first record holds the replay to slime's own result.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from deepdive.rollout_settings import GENERATE_FUNCTION_PATH, REWARD_FUNCTION_PATH
from services.base.errors import ConfigError
from slurm.backends.slime.args import slime_arguments
from slurm.backends.slime.checks import check_slime
from slurm.backends.slime.config import max_tokens_per_gpu
from slurm.backends.slime.replay import replay
from slurm.config import ExperimentConfig, load_experiment
from tests.helpers import slime_recipe

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((Path(__file__).parent / "golden" / "slime_parse.json").read_text())
WORLD = "{WORLD}"
SLIME_CONFIGS = sorted(
    str(path.relative_to(ROOT))
    for path in (ROOT / "configs").glob("*.toml")
    if tomllib.loads(path.read_text()).get("run", {}).get("backend") == "slime"
)
RERECORD = (
    "the launcher's argv is not the one slime parsed: re-record where slime imports with "
    "scripts/slime_parse.py (its docstring says how)"
)
# set by Megatron-LM's parse_args after parsing, from RANK and WORLD_SIZE
# (megatron/training/arguments.py, lines 113-114), not by any flag
FROM_ENVIRONMENT = {"rank", "world_size"}


def recorded_world(root: Path) -> None:
    for name, text in RECORD["world"]["files"].items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "keys.env").chmod(0o600)


def load(name: str, root: Path, *extra: str) -> ExperimentConfig:
    overrides = [item.replace(WORLD, str(root)) for item in RECORD["world"]["overrides"]]
    return load_experiment(ROOT / name, [*overrides, *extra])


def argv(config: ExperimentConfig, root: Path) -> list[str]:
    command = slime_arguments(config, root / "deepdive_rollout.yaml")
    return command.arguments()


def placeholders(value: Any, root: Path) -> Any:
    loaded = json.loads(json.dumps(value).replace(str(root), WORLD))
    return loaded


def test_every_slime_config_is_recorded() -> None:
    assert SLIME_CONFIGS and sorted(RECORD["configs"]) == SLIME_CONFIGS


@pytest.mark.parametrize("name", SLIME_CONFIGS)
def test_slime_parsed_this_argv_and_accepted_it(name: str, tmp_path: Path) -> None:
    recorded_world(tmp_path)
    record = RECORD["configs"][name]
    assert placeholders(argv(load(name, tmp_path), tmp_path), tmp_path) == record["argv"], RERECORD
    assert record["unknown_flags"] == []  # no flag every parser of slime left over
    assert record["validated"] == {**record["validated"], "ok": True, "error": None}


@pytest.mark.parametrize("name", SLIME_CONFIGS)
def test_the_replay_parses_as_slime_did(name: str, tmp_path: Path) -> None:
    record = RECORD["configs"][name]
    parsed = replay([item.replace(WORLD, str(tmp_path)) for item in record["argv"]])
    ours = placeholders(parsed.namespace, tmp_path)
    theirs = {k: v for k, v in record["parsed"].items() if k not in FROM_ENVIRONMENT}
    assert set(ours) == set(theirs)
    for dest in parsed.approximate:  # an opaque type: the replay keeps the string
        assert ours.pop(dest) == str(theirs.pop(dest))
    assert ours == theirs
    assert parsed.ignored == []


def meant(config: ExperimentConfig) -> dict[str, Any]:
    """What the config's keys mean on slime's namespace, with the type slime must read."""
    slime, rollout = config.slime, config.slime.rollout
    parallel, optimizer, misc = slime.parallelism, slime.optimizer, slime.misc
    return {
        "rollout_top_p": float(rollout.top_p),
        "rollout_temperature": float(rollout.temperature),
        "rollout_max_context_len": rollout.max_context_len,
        "rollout_max_response_len": rollout.max_response_len,
        "seq_length": rollout.max_context_len,
        "max_position_embeddings": rollout.max_context_len,
        "rollout_shuffle": rollout.shuffle,
        "rollout_batch_size": rollout.rollout_batch_size,
        "n_samples_per_prompt": rollout.n_samples_per_prompt,
        "global_batch_size": rollout.global_batch_size,
        "lr": float(optimizer.lr),
        "weight_decay": float(optimizer.weight_decay),
        "adam_beta2": float(optimizer.adam_beta2),
        "optimizer_cpu_offload": optimizer.cpu_offload,
        "use_precision_aware_optimizer": optimizer.cpu_offload,
        "attention_dropout": float(misc.attention_dropout),
        "hidden_dropout": float(misc.hidden_dropout),
        "accumulate_allreduce_grads_in_fp32": misc.accumulate_allreduce_grads_in_fp32,
        "attention_softmax_in_fp32": misc.attention_softmax_in_fp32,
        "attention_backend": f"AttnBackend.{misc.attention_backend}",
        "num_gpus_per_node": config.slurm.gpus_per_node,
        "tensor_model_parallel_size": parallel.tensor,
        "sequence_parallel": parallel.sequence_parallel,
        "recompute_granularity": parallel.recompute_granularity or None,
        "use_dynamic_batch_size": parallel.use_dynamic_batch_size,
        "max_tokens_per_gpu": max_tokens_per_gpu(slime)
        if parallel.use_dynamic_batch_size
        else None,
        "colocate": slime.resources.colocate,
        "offload": slime.resources.offload,
        # slime's sglang_parse_args defaults it from --rollout-num-gpus-per-engine
        "sglang_tensor_parallel_size": slime.resources.rollout_num_gpus_per_engine,
        "router_balance_abs_threshold": slime.sglang.router_balance_abs_threshold,
        "router_policy": slime.sglang.router_policy,
        # passed with manual only; slime's parser keeps the router's own default otherwise
        "router_assignment_mode": slime.sglang.router_assignment_mode
        if slime.sglang.router_policy == "manual"
        else "random",
        "kl_loss_coef": float(slime.algorithm.kl_loss_coef),
        "eps_clip_high": float(slime.algorithm.eps_clip_high),
        "custom_generate_function_path": GENERATE_FUNCTION_PATH,
        "custom_rm_path": REWARD_FUNCTION_PATH,
    }


@pytest.mark.parametrize("name", SLIME_CONFIGS)
def test_slime_reads_the_values_the_toml_meant(name: str, tmp_path: Path) -> None:
    recorded_world(tmp_path)
    config = load(name, tmp_path)
    namespace = replay(argv(config, tmp_path)).namespace
    for dest, value in meant(config).items():
        assert namespace[dest] == value, dest
        assert type(namespace[dest]) is type(value), dest  # 1.0, not "1.0" or 1


def test_eval_sets_arrive_as_one_list_of_names_and_paths(world: dict[str, Path]) -> None:
    sets = f'{{ bc = "{world["prompts"]}", web = "{world["prompts"]}" }}'
    config = slime_recipe(world, f"slime.eval.sets={sets}", "slime.eval.interval=5")
    arguments = slime_arguments(config, Path("/x.yaml"))
    namespace = replay(arguments.arguments()).namespace
    path = str(world["prompts"])
    assert namespace["eval_prompt_data"] == ["bc", path, "web", path]
    assert namespace["eval_interval"] == 5 and namespace["n_samples_per_eval_prompt"] == 1


def test_the_extra_args_arrive_as_their_flags_mean(world: dict[str, Path]) -> None:
    namespace = replay(slime_arguments(slime_recipe(world), Path("/x.yaml")).arguments()).namespace
    assert namespace["check_for_nan_in_loss_and_grad"] is False  # --no-check-for-nan-...
    assert namespace["override_opt_param_scheduler"] is True


def test_slimes_abbreviations_would_misread_the_gpu_flags_in_the_other_order() -> None:
    """slime reads --rollout-num-gpus-per-engine with a parser that allows abbreviations
    (slime/backends/sglang_utils/arguments.py, `sglang_parse_args`): --rollout-num-gpus is
    taken for it, so its value wins when it comes last. The builder writes it first."""
    late = replay(["--rollout-num-gpus-per-engine", "4", "--rollout-num-gpus", "16"])
    assert late.namespace["sglang_tensor_parallel_size"] == 16  # the trap, as slime has it
    early = replay(["--rollout-num-gpus", "16", "--rollout-num-gpus-per-engine", "4"])
    assert early.namespace["sglang_tensor_parallel_size"] == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('["--lr", "abc"]', "argument --lr: invalid float value: 'abc'"),
        ('["--attention-backend", "flashy"]', "invalid AttnBackend value: 'flashy'"),
        ('["--ckpt-format", "zarr"]', "argument --ckpt-format: invalid choice: 'zarr'"),
        ('["--balance-data", "yes"]', "yes: none of slime's parsers takes it"),
    ],
)
def test_the_checks_refuse_what_slimes_parsers_would(
    world: dict[str, Path], extra: str, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        check_slime(slime_recipe(world, f"slime.extra_args={extra}"))
    assert message in error.value.message
