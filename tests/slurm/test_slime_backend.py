"""The slime backend's config, argument builder and checks (slurm/backends/slime/): slime's
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
import tomli_w
import yaml

from deepdive.rollout_settings import (
    GENERATE_FUNCTION_PATH,
    REWARD_FUNCTION_PATH,
    settings_from_args,
)
from services.base.errors import ConfigError, RuntimeFailure
from slurm.backends import build_backend
from slurm.backends.slime.args import custom_config, presets, render, slime_arguments
from slurm.backends.slime.backend import SlimeBackend
from slurm.backends.slime.checks import check_slime, slime_flags
from slurm.cluster_note import ClusterNode, ClusterNote, write_cluster
from slurm.launch.command import check_same_run
from slurm.launch.preflight import missing_inputs, require_inputs
from slurm.run_folder import AttemptFolder, RunFolder
from tests.helpers import DEEPDIVE, SLIME_RECIPE, slime_dry_run
from tests.helpers import slime_overrides as overrides
from tests.helpers import slime_recipe as recipe

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
RECIPE = SLIME_RECIPE


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
    command = slime_arguments(config, Path("/run/attempt/deepdive_rollout.yaml"))
    check("slime_command.txt", placeholders(render(command, "/opt/slime"), world) + "\n")
    # the hooks are ours, the run folder holds the checkpoints, no --group-rm, ever
    arguments = command.arguments()
    assert arguments[arguments.index("--custom-generate-function-path") + 1] == (
        GENERATE_FUNCTION_PATH
    )
    assert arguments[arguments.index("--custom-rm-path") + 1] == REWARD_FUNCTION_PATH
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
    command = slime_arguments(config, Path("/x.yaml"))
    unknown = [flag for flag in command.flags() if flag not in slime_flags()]
    assert not unknown
    assert "--dynamic-sampling-filter-path" in command.flags()
    assert "deepdive.filters.drop_uniform_or_failed_groups" in command.arguments()


def test_the_yaml_carries_our_keys_and_the_hook_reads_them_back(world: dict[str, Path]) -> None:
    config = recipe(world)
    tools, reward = (("http://10.0.0.1:20010",),), ("http://10.0.0.1:20011",)
    written = yaml.safe_load(yaml.safe_dump(custom_config(config, tools, reward)))
    assert "deepdive_sglang_url" not in written  # inside slime: its router
    assert written["deepdive_tool_server_url"] == [["http://10.0.0.1:20010"]]  # YAML lists
    assert written["deepdive_reward_server_url"] == ["http://10.0.0.1:20011"]
    # slime sets every key of the file on args (slime/utils/arguments.py, lines 2013-2019)
    args = Namespace(
        sglang_router_ip="10.0.0.1",
        sglang_router_port=30000,
        rollout_max_context_len=64000,
        **written,
    )
    settings = settings_from_args(args)
    assert settings.sglang_url == "http://10.0.0.1:30000"
    assert (settings.tool_server_url, settings.reward_server_url) == (tools, reward)
    assert (settings.max_turns, settings.on_malformed, settings.retries) == (64, "fail", 4)


def cluster_note(attempt: AttemptFolder, nodes: list[tuple[list[str], str]]) -> None:
    """An attempt's cluster.json as node 0's bootstrap writes it once every node is ready
    (slurm/bootstrap.py, `_join`, with slurm.cluster_note): each node's tool workers and
    reward URL."""
    attempt.root.mkdir(parents=True, exist_ok=True)
    entries = tuple(
        ClusterNode(n, f"deepdive_node_{n}", tuple(tools), reward)
        for n, (tools, reward) in enumerate(nodes)
    )
    write_cluster(attempt.cluster, ClusterNote(attempt.root.name, "x:6379", entries))


def slime_reads(path: Path) -> Namespace:
    """The YAML as slime puts it on args (slime/utils/arguments.py, lines 2013-2019: every key
    of yaml.safe_load's mapping setattr()ed), with its router's address."""
    args = Namespace(sglang_router_ip="10.0.0.1", sglang_router_port=30000)
    for key, value in (yaml.safe_load(path.read_text()) or {}).items():
        setattr(args, key, value)
    return args


def test_the_yaml_carries_every_nodes_urls_and_each_attempt_its_own(
    world: dict[str, Path],
) -> None:
    """Node 0 writes the YAML from the attempt's cluster note: every worker of every node's
    tool server, every node's reward server. A requeued attempt serves on new addresses and
    ports; its YAML (and the --custom-config-path its train.py is given) has them."""
    backend = SlimeBackend(recipe(world))
    run = RunFolder(world["root"] / "run")
    first, requeued = run.attempt("7-0"), run.attempt("7-1")
    cluster_note(
        first,
        [
            (["http://10.0.0.1:20010", "http://10.0.0.1:20011"], "http://10.0.0.1:20020"),
            (["http://10.0.0.2:20010", "http://10.0.0.2:20011"], "http://10.0.0.2:20020"),
        ],
    )
    cluster_note(
        requeued,
        [
            (["http://10.0.0.5:21010", "http://10.0.0.5:21011"], "http://10.0.0.5:21020"),
            (["http://10.0.0.6:21010", "http://10.0.0.6:21011"], "http://10.0.0.6:21020"),
        ],
    )
    backend.before_training(first)
    backend.before_training(requeued)
    written = yaml.safe_load((first.root / "deepdive_rollout.yaml").read_text())
    assert written["deepdive_tool_server_url"] == [  # lists, as YAML holds them
        ["http://10.0.0.1:20010", "http://10.0.0.1:20011"],
        ["http://10.0.0.2:20010", "http://10.0.0.2:20011"],
    ]
    assert written["deepdive_reward_server_url"] == [
        "http://10.0.0.1:20020",
        "http://10.0.0.2:20020",
    ]
    settings = settings_from_args(slime_reads(first.root / "deepdive_rollout.yaml"))
    assert settings.tool_server_nodes == (
        ("http://10.0.0.1:20010", "http://10.0.0.1:20011"),
        ("http://10.0.0.2:20010", "http://10.0.0.2:20011"),
    )
    assert settings.reward_server_urls == ("http://10.0.0.1:20020", "http://10.0.0.2:20020")
    again = settings_from_args(slime_reads(requeued.root / "deepdive_rollout.yaml"))
    assert again.tool_server_nodes == (
        ("http://10.0.0.5:21010", "http://10.0.0.5:21011"),
        ("http://10.0.0.6:21010", "http://10.0.0.6:21011"),
    )
    assert again.reward_server_urls == ("http://10.0.0.5:21020", "http://10.0.0.6:21020")
    command = backend.command(requeued)
    path = command[command.index("--custom-config-path") + 1]
    assert path == str(requeued.root / "deepdive_rollout.yaml")


def test_a_cluster_note_without_a_nodes_urls_is_named(world: dict[str, Path]) -> None:
    backend = SlimeBackend(recipe(world))
    attempt = RunFolder(world["root"] / "run").attempt("7-0")
    cluster_note(attempt, [(["http://10.0.0.1:20010"], "http://10.0.0.1:20020")])
    note = json.loads(attempt.cluster.read_text())
    del note["nodes"][0]["reward"]
    attempt.cluster.write_text(json.dumps(note))
    with pytest.raises(
        RuntimeFailure, match=r"cluster.json: node entry 0 lacks its node, resource, tools"
    ):
        backend.before_training(attempt)
    assert not (attempt.root / "deepdive_rollout.yaml").exists()


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
        (
            [
                'slime.extra_args=["--rollout-function-path=slime.rollout.fully_async_rollout.generate_rollout_fully_async"]'
            ],
            "its worker thread only logs the hook's refusal",
        ),
        (
            ['slime.extra_args=["--data-source-path", "my.source.Source"]'],
            "--data-source-path my.source.Source: the launcher passes",
        ),
        (['slime.extra_args=["--lr-warmup-fraction"]'], "--lr-warmup-fraction takes a value"),
        # our hooks and the YAML stay ours: argparse keeps the last value (2a5d2bd passed these)
        (
            ['slime.extra_args=["--custom-rollout-log-function-path", "my.log"]'],
            "--custom-rollout-log-function-path: the launcher sets it (deepdive.aborts.",
        ),
        (
            ['slime.extra_args=["--custom-generate-function-path=my.generate"]'],
            f"--custom-generate-function-path: the launcher sets it ({GENERATE_FUNCTION_PATH})",
        ),
        (
            [f'slime.extra_args=["--custom-rm-path", "{REWARD_FUNCTION_PATH}"]'],
            "--custom-rm-path: the launcher sets it",
        ),
        (
            ['slime.extra_args=["--custom-config-path", "/mine.yaml"]'],
            "and with it every node's service URLs",
        ),
        (
            [
                "slime.rollout.drop_uniform_groups=true",
                'slime.extra_args=["--dynamic-sampling-filter-path", "my.filter"]',
            ],
            "--dynamic-sampling-filter-path: the launcher sets it (deepdive.filters.",
        ),
        (
            ["slurm.nodes=4"],
            "slurm.nodes: 4 nodes, but slime uses 16 GPUs (actor 16, the rollout on the same "
            "GPUs) = 2 node(s) of 8: 2 would sit idle",
        ),
        (['services.host="127.0.0.1"'], "services.host: an address the other nodes reach"),
        (['slime.model.ref_load=""'], "slime.model.ref_load: the reference torch_dist checkpoint"),
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


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ['slime.rollout.prompt_data="/nowhere.jsonl"'],
            "slime.rollout.prompt_data: /nowhere.jsonl",
        ),
        (['slime.model.ref_load="/nowhere"'], "slime.model.ref_load: /nowhere is not a folder"),
        (['slime.model.hf_checkpoint="/nowhere"'], "slime.model.hf_checkpoint: /nowhere has no"),
        (['slime.eval.sets={held="/nowhere.jsonl"}'], "slime.eval.sets.held: /nowhere.jsonl"),
    ],
)
def test_what_the_job_reads_is_listed_when_missing(
    world: dict[str, Path], extra: list[str], message: str
) -> None:
    """check_slime judges the config alone (a dry run needs no model yet); the inputs that
    must exist are listed by the preflight, and a real submission refuses them."""
    config = recipe(world, *extra)
    check_slime(config)
    assert [item for item in missing_inputs(config) if item.startswith(message)]
    with pytest.raises(ConfigError, match=message.split(":")[0]):
        require_inputs(config)


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
    assert environment["PYTHONPATH"].startswith("/opt/slime:/opt/Megatron-LM")
    command = backend.command(RunFolder(world["root"] / "run").attempt("7-0"))
    # the image's python, slime's train.py through our driver (slurm/backends/slime/driver.py)
    assert command[:3] == ["python3", "-m", "slurm.backends.slime.driver"]
    assert backend.working_directory() == "/opt/slime"


def test_the_dry_run_prints_the_sbatch_script_the_slime_command_and_the_yaml(
    world: dict[str, Path],
) -> None:
    result = slime_dry_run(world)
    assert result.returncode == 0, result.stderr
    check("dry_run_slime.txt", placeholders(result.stdout, world))
    assert not (world["root"] / "run").exists()


def test_an_extra_rollout_log_function_no_longer_passes_the_dry_run(
    world: dict[str, Path],
) -> None:
    """On 2a5d2bd this dry run printed the job: slime would have run another log function than
    deepdive.aborts', and the abort-share stop with it."""
    extra = 'slime.extra_args=["--custom-rollout-log-function-path", "mine.log_rollout"]'
    result = slime_dry_run(world, extra)
    assert result.returncode == 2, result.stdout
    assert "slime.extra_args: --custom-rollout-log-function-path: the launcher sets it" in (
        result.stderr
    )


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


def test_a_run_folder_continues_only_the_run_it_was_started_with(world: dict[str, Path]) -> None:
    """The backend says what its checkpoints fix (slime: the model and the layout); another
    backend never continues a folder."""
    config = recipe(world)
    run = config.run_folder
    run.root.mkdir(parents=True)
    run.config.write_text(tomli_w.dumps(config.as_dict()))
    check_same_run(recipe(world, "slime.rollout.num_rollout=10"), run)  # the same run
    with pytest.raises(ConfigError, match=r"started with another slime.parallelism: its check"):
        check_same_run(recipe(world, "slime.parallelism.tensor=8"), run)
    with pytest.raises(ConfigError, match=r"holds a slime run: run.backend = 'local' needs"):
        check_same_run(recipe(world, 'run.backend="local"'), run)


def test_eval_plays_trainings_episodes_with_the_backends_engine(world: dict[str, Path]) -> None:
    """Each backend's engine: what a checkpoint is, and training's knobs, context and response
    budget (evaluation used the hook's own defaults for the timeouts and retries before)."""
    slime = build_backend(recipe(world, "slime.deepdive.tool_timeout_s=42")).eval_engine()
    assert slime.description.startswith("SGLang")
    played = slime.rollout()
    assert (played.knobs.tool_timeout_s, played.knobs.retries) == (42, 4)
    assert (played.max_context_tokens, played.max_response_tokens) == (32768, 32768)
    assert slime.resolve(str(world["model"])).kind == "hf"
    with pytest.raises(ConfigError, match=r"not a Hugging Face model folder \(config.json\)$"):
        slime.resolve(str(world["root"]))  # a training checkpoint is not served: converted first
    local = build_backend(recipe(world, 'run.backend="local"', "local.rollout.retries=1"))
    engine = local.eval_engine()
    assert engine.description == "the local engine"
    assert (engine.rollout().knobs.retries, engine.rollout().max_response_tokens) == (1, 512)
    with pytest.raises(ConfigError, match=r"nor a training checkpoint \(state.pt\)"):
        engine.resolve(str(world["root"]))


def test_eval_and_convert_checkpoint_are_the_backends_own(world: dict[str, Path]) -> None:
    model = str(world["model"])
    rows = world["root"] / "eval.jsonl"
    rows.write_text('{"input_messages": [], "label": "x"}\n')
    eval_dry_run = subprocess.run(
        [*DEEPDIVE, "eval", str(RECIPE), "--checkpoint", model, "--data", str(rows),
         "--dry-run", *[item for value in overrides(world) for item in ("--set", value)]],
        capture_output=True, text=True, timeout=60, cwd=world["root"],
    )  # fmt: skip
    assert eval_dry_run.returncode == 0, eval_dry_run.stderr
    served = (
        f"Qwen2.5-32B-Instruct: {model} (hf), served by SGLang (python -m sglang.launch_server)"
    )
    assert served in eval_dry_run.stdout
    local = subprocess.run(
        [*DEEPDIVE, "convert-checkpoint", "to-hf", str(ROOT / "configs" / "cluster-local.toml"),
         "--dry-run"],
        capture_output=True, text=True, timeout=60, cwd=world["root"],
    )  # fmt: skip
    assert local.returncode == 2 and "convert-checkpoint converts slime checkpoints" in local.stderr
