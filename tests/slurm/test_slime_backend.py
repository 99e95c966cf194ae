"""The slime backend's config, argument builder and checks (slurm/slime_*.py): slime's
command line against a recorded file, every emitted flag in slime's flag list, and each check
with a failing example. slime cannot be installed here; the flag list comes from its parsers at
the pinned commits (scripts/slime_flags.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import yaml

from deepdive.rollout_settings import settings_from_args
from services.exceptions import ConfigError
from slurm.backends.slime import SlimeBackend
from slurm.config import ExperimentConfig, load_experiment
from slurm.run_folder import RunFolder
from slurm.slime_args import presets, render, slime_arguments
from slurm.slime_checks import check_slime, slime_flags
from tests.helpers import DEEPDIVE

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
RECIPE = ROOT / "configs" / "deepdive-qwen.toml"
QWEN25_32B = {  # what Qwen2.5-32B-Instruct's config.json says
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_attention_heads": 40,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rope_theta": 1000000.0,
    "vocab_size": 152064,
}


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """The files the recipe names, made here: a model folder, its torch_dist, prompts, an
    image, an env file."""
    model = tmp_path / "models" / "Qwen2.5-32B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(QWEN25_32B))
    reference = tmp_path / "models" / "Qwen2.5-32B-Instruct_torch_dist"
    reference.mkdir()
    prompts = tmp_path / "data" / "train.jsonl"
    prompts.parent.mkdir()
    prompts.write_text('{"input_messages": []}\n')
    image = tmp_path / "train.sif"
    image.write_bytes(b"sif")
    env = tmp_path / "keys.env"
    env.write_text("SERPER_API_KEY=x\n")
    env.chmod(0o600)
    return {
        "model": model,
        "ref": reference,
        "prompts": prompts,
        "image": image,
        "env": env,
        "root": tmp_path,
    }


def overrides(world: dict[str, Path], *extra: str) -> list[str]:
    return [
        f'run.folder="{world["root"] / "run"}"',
        f'slime.model.hf_checkpoint="{world["model"]}"',
        f'slime.model.ref_load="{world["ref"]}"',
        f'slime.rollout.prompt_data="{world["prompts"]}"',
        f'container.image="{world["image"]}"',
        f'services.env_file="{world["env"]}"',
        *extra,
    ]


def recipe(world: dict[str, Path], *extra: str) -> ExperimentConfig:
    return load_experiment(RECIPE, overrides(world, *extra))


def placeholders(text: str, world: dict[str, Path]) -> str:
    return text.replace(str(world["root"]), "{ROOT}").replace(sys.executable, "{PYTHON}")


def check(name: str, text: str) -> None:
    record = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        record.write_text(text)
    assert text == record.read_text()


def test_the_recipe_passes_every_check_and_renders_as_recorded(world: dict[str, Path]) -> None:
    config = recipe(world)
    check_slime(config)
    command = slime_arguments(
        config,
        Path("/run/attempt/deepdive_rollout.yaml"),
        {"tools": "http://10.0.0.1:20010", "reward": "http://10.0.0.1:20011"},
    )
    check("slime_command.txt", placeholders(render(command, "/root/slime/train.py"), world) + "\n")
    # the hooks are ours, the run folder holds the checkpoints, no --group-rm, ever
    arguments = command.arguments()
    assert (
        arguments[arguments.index("--custom-generate-function-path") + 1]
        == "deepdive.rollout.generate_with_tool"
    )
    assert arguments[arguments.index("--custom-rm-path") + 1] == "deepdive.rollout.reward_func"
    folder = str(world["root"] / "run" / "slime_checkpoints")
    assert (
        arguments[arguments.index("--save") + 1]
        == arguments[arguments.index("--load") + 1]
        == folder
    )
    assert "--group-rm" not in arguments and "--rm-type" not in arguments
    preset = presets()["qwen2.5-32B"]["args"]
    assert dict(command.groups)["MODEL_ARGS"][: len(preset)] == preset


def test_every_emitted_flag_is_a_flag_of_slime(world: dict[str, Path]) -> None:
    """slime ignores an unknown flag without a word; the builder must never write one, with
    any switch of the config on."""
    config = recipe(
        world,
        "slime.fault_tolerance.enabled=true",
        f'slime.eval.sets={{ bc = "{world["prompts"]}" }}',
        "slime.eval.interval=5",
        "slime.rollout.drop_uniform_groups=true",
        "slime.rollout.drop_failed_groups=true",
        "slime.rollout.over_sampling_batch_size=32",
        'slime.parallelism.recompute_granularity="full"',
        'slime.parallelism.recompute_method="uniform"',
        "slime.parallelism.recompute_num_layers=1",
        "slime.sglang.context_length=65536",
    )
    command = slime_arguments(
        config, Path("/x.yaml"), {"tools": "http://a/", "reward": "http://b/"}
    )
    unknown = [flag for flag in command.flags() if flag not in slime_flags()]
    assert not unknown
    assert "--dynamic-sampling-filter-path" in command.flags()
    assert "deepdive.filters.drop_uniform_or_failed_groups" in command.arguments()


def test_the_yaml_carries_our_keys_and_the_hook_reads_them_back(world: dict[str, Path]) -> None:
    config = recipe(world)
    urls = {"tools": "http://10.0.0.1:20010", "reward": "http://10.0.0.1:20011"}
    command = slime_arguments(config, Path("/x.yaml"), urls)
    written = yaml.safe_load(yaml.safe_dump(command.custom_config))
    assert "deepdive_sglang_url" not in written  # inside slime: its router
    # slime sets every key of the file on args (slime/utils/arguments.py, lines 2013-2019)
    args = Namespace(
        sglang_router_ip="10.0.0.1",
        sglang_router_port=30000,
        rollout_max_context_len=64000,
        **written,
    )
    settings = settings_from_args(args)
    assert settings.sglang_url == "http://10.0.0.1:30000"
    assert (settings.tool_server_url, settings.reward_server_url) == (urls["tools"], urls["reward"])
    assert (settings.max_turns, settings.on_malformed, settings.retries) == (64, "fail", 5)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["slime.rollout.global_batch_size=64"],
            "must equal global_batch_size x num_steps_per_rollout",
        ),
        (["slime.resources.colocate=false"], "GPUs must fit the job's 16"),
        (
            ["slime.resources.actor_num_nodes=3"],
            "slime.resources.actor_num_nodes: at most slurm.nodes (2)",
        ),
        (
            ["slime.parallelism.tensor=3"],
            "slime.parallelism.tensor: 3 does not divide the model's 40 attention heads",
        ),
        (["slime.parallelism.tensor=10"], "does not divide the model's 8 query groups"),
        (['slime.model.preset="qwen3-32B"'], "does not match"),
        (['slime.model.preset="qwen9-1B"'], "slime.model.preset: one of"),
        (
            ['slime.extra_args=["--invented-flag"]'],
            "--invented-flag is not a flag of slime at slime 624b824",
        ),
        (
            ['slime.extra_args=["--sglang-router-balance-abs-threshold", "0"]'],
            "did you mean --router-balance-abs-threshold",
        ),
        (
            ['slime.extra_args=["--partial-rollout"]'],
            "cannot continue an aborted multi-turn episode",
        ),
        (['slime.extra_args=["--group-rm"]'], "slime's evaluation asserts against group RM"),
        (
            [
                'slime.extra_args=["--rollout-function-path", "slime.rollout.fully_async_rollout.generate_rollout_fully_async"]'
            ],
            "fully-async",
        ),
        (['slime.extra_args=["--lr-warmup-fraction"]'], "--lr-warmup-fraction takes a value"),
        (['services.host="127.0.0.1"'], "services.host: an address the other nodes reach"),
        (['slime.model.ref_load=""'], "slime.model.ref_load: the reference torch_dist checkpoint"),
        (
            ['slime.rollout.prompt_data="/nowhere.jsonl"'],
            "slime.rollout.prompt_data: /nowhere.jsonl: no such file",
        ),
        (
            [
                "slurm.gpus_per_node=0",
                "slime.resources.actor_num_gpus_per_node=1",
                "slime.resources.rollout_num_gpus=0",
            ],
            "slurm.gpus_per_node: at least 1",
        ),
    ],
)
def test_each_check_names_the_key(world: dict[str, Path], extra: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_slime(recipe(world, *extra))
    assert message in error.value.message


def test_a_preset_that_does_not_match_the_model_says_which_numbers(world: dict[str, Path]) -> None:
    with pytest.raises(ConfigError) as error:
        check_slime(recipe(world, 'slime.model.preset="qwen2.5-7B"'))
    message = error.value.message
    assert "slime.model.preset 'qwen2.5-7B' does not match" in message
    assert "hidden_size 5120 != --hidden-size 3584" in message
    assert "num_hidden_layers 64 != --num-layers 28" in message


def test_the_backend_resumes_from_the_newest_complete_checkpoint(world: dict[str, Path]) -> None:
    backend = SlimeBackend(recipe(world))
    assert backend.resume_point() is None
    folder = world["root"] / "run" / "slime_checkpoints"
    folder.mkdir(parents=True)
    (folder / "iter_0000040").mkdir()  # written, but its save never completed
    assert backend.resume_point() is None
    (folder / "latest_checkpointed_iteration.txt").write_text("20\n")
    assert backend.resume_point() == f"iteration 20 ({folder})"


def test_the_backend_gives_every_node_slimes_environment(world: dict[str, Path]) -> None:
    backend = SlimeBackend(recipe(world, 'slime.socket_ifname="ib0"'))
    environment = backend.environment("10.0.0.7")
    assert environment["SLIME_HOST_IP"] == "10.0.0.7"
    assert environment["GLOO_SOCKET_IFNAME"] == environment["NCCL_SOCKET_IFNAME"] == "ib0"
    assert environment["PYTHONPATH"].startswith("/root/slime:/root/Megatron-LM")
    command = backend.command(RunFolder(world["root"] / "run").attempt("7-0"))
    assert command[:2] == ["python3", "/root/slime/train.py"]  # the image's python
    assert backend.working_directory() == "/root/slime"


def test_the_dry_run_prints_the_sbatch_script_the_slime_command_and_the_yaml(
    world: dict[str, Path],
) -> None:
    arguments = [item for value in overrides(world) for item in ("--set", value)]
    result = subprocess.run(
        [*DEEPDIVE, "submit", str(RECIPE), "--dry-run", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=world["root"],
    )
    assert result.returncode == 0, result.stderr
    check("dry_run_slime.txt", placeholders(result.stdout, world))
    assert not (world["root"] / "run").exists()


def test_the_recipe_without_its_files_fails_before_anything_is_submitted(tmp_path: Path) -> None:
    result = subprocess.run(
        [*DEEPDIVE, "submit", str(RECIPE), "--dry-run", "--set", f'run.folder="{tmp_path / "r"}"'],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    # the first missing file loading checks (the image, on the submitting host, comes after)
    assert "services.env_file" in result.stderr
