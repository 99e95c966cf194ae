"""Every turn of every episode is a request SGLang serves: the context an episode may grow to
(`[slime.rollout] max_context_len`) and its response budget against what the model's
config.json lets SGLang serve, before training is submitted and before `deepdive eval` starts
SGLang. SGLang 0.5.15.post1 refuses an input that reaches its context length and an input +
max_new_tokens past it (python/sglang/srt/managers/tokenizer_manager.py,
`_validate_one_request`); the rollout would mark every episode ABORTED with reward 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.base.errors import ConfigError
from slurm.backends import Checkpoint
from slurm.backends.slime.args import slime_arguments
from slurm.backends.slime.checks import check_slime
from slurm.backends.slime.model_context import model_context
from slurm.backends.slime.sglang_server import server_command
from slurm.launch.evaluate import evaluate
from tests.helpers import QWEN25_32B
from tests.helpers import slime_recipe as recipe


def flag(arguments: list[str], name: str) -> str:
    return arguments[arguments.index(name) + 1]


def write_model(folder: Path, **changes: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**QWEN25_32B, **changes}))
    return folder


def test_the_recipe_asks_for_the_context_the_model_serves_and_tells_sglang(
    world: dict[str, Path],
) -> None:
    config = recipe(world)
    assert check_slime(config) == []
    arguments = slime_arguments(config, Path("/x.yaml")).arguments()
    assert flag(arguments, "--rollout-max-context-len") == "32768"
    assert flag(arguments, "--sglang-context-length") == "32768"  # pinned, not SGLang's guess
    assert int(flag(arguments, "--rollout-max-response-len")) <= 32768
    assert flag(arguments, "--seq-length") == flag(arguments, "--max-position-embeddings")


def test_deepdives_64000_tokens_on_a_32768_token_model_is_refused_with_the_numbers(
    world: dict[str, Path],
) -> None:
    """DeepDive's script asks for 64,000 tokens of Qwen2.5-32B-Instruct, which serves 32,768:
    every turn would get HTTP 400."""
    config = recipe(world, "slime.rollout.max_context_len=64000")
    with pytest.raises(ConfigError) as error:
        check_slime(config)
    message = error.value.message
    assert message.startswith("slime.rollout.max_context_len: 64000 tokens per episode")
    assert "SGLang serves 32768" in message and "max_position_embeddings 32768" in message


def test_a_response_budget_past_the_context_is_refused(world: dict[str, Path]) -> None:
    with pytest.raises(ConfigError) as error:
        check_slime(recipe(world, "slime.rollout.max_response_len=40000"))
    assert error.value.message.startswith("slime.rollout.max_response_len: 40000")
    assert "32768" in error.value.message


def test_an_sglang_context_above_the_models_is_refused(world: dict[str, Path]) -> None:
    """SGLang will not start with a --context-length above what it derives from config.json
    (python/sglang/srt/configs/model_config.py, `_derive_context_length`)."""
    with pytest.raises(ConfigError) as error:
        check_slime(recipe(world, "slime.sglang.context_length=65536"))
    message = error.value.message
    assert message.startswith("slime.sglang.context_length: 65536")
    assert "32768" in message and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in message


def test_a_longer_model_context_is_used_as_far_as_asked(world: dict[str, Path]) -> None:
    write_model(world["model"], max_position_embeddings=131072)
    config = recipe(world, "slime.rollout.max_context_len=65536")
    check_slime(config)  # refuses nothing (it warns of memory at twice the tokens)
    arguments = slime_arguments(config, Path("/x.yaml")).arguments()
    assert flag(arguments, "--sglang-context-length") == "65536"


def test_yarn_in_config_json_is_refused_for_a_model_megatron_trains_with_plain_rope(
    world: dict[str, Path],
) -> None:
    """Qwen's README enables YaRN by editing config.json; SGLang would then sample with it while
    Megatron-LM 1dcf0da trains a dense model with plain RoPE (its --position-embedding-type
    has no yarn, megatron/training/arguments.py:1671)."""
    yarn = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}
    write_model(world["model"], rope_scaling=yarn)
    with pytest.raises(ConfigError) as error:
        check_slime(recipe(world))
    assert "YaRN" in error.value.message and "plain RoPE" in error.value.message


@pytest.mark.parametrize(
    ("config", "derived", "extended"),
    [
        ({"max_position_embeddings": 32768}, 32768, 32768),
        # Qwen's YaRN recipe: SGLang ignores the factor when the original length is named
        # (python/sglang/srt/utils/hf_transformers/common.py, get_context_length)
        (
            {
                "max_position_embeddings": 32768,
                "rope_scaling": {
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                    "type": "yarn",
                },
            },
            32768,
            131072,
        ),
        # SGLang prefers seq_length to max_position_embeddings (CONTEXT_LENGTH_KEYS' order)
        ({"seq_length": 8192, "max_position_embeddings": 32768}, 8192, 8192),
        ({"text_config": {"max_position_embeddings": 40960}}, 40960, 40960),
        ({}, 2048, 2048),  # SGLang's default without any key
        (
            {"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "default"}},
            32768,
            32768,
        ),
    ],
)
def test_the_context_is_derived_as_sglang_derives_it(
    config: dict[str, object], derived: int, extended: int
) -> None:
    found = model_context(config)
    assert (found.derived, found.extended) == (derived, extended)


def test_eval_serves_with_trainings_context_and_engine_size() -> None:
    command = server_command(Path("/m"), 30001, 32768, 4)
    assert flag(command, "--context-length") == "32768"
    assert flag(command, "--tp-size") == "4"
    assert "--context-length" not in server_command(Path("/m"), 30001, 0, 1)


def test_eval_refuses_a_checkpoint_that_cannot_hold_an_episode_before_starting_anything(
    world: dict[str, Path], tmp_path: Path
) -> None:
    """`deepdive eval` of a checkpoint whose config.json serves less than training's context
    stops before any service or SGLang starts (no GPU is needed to see it)."""
    small = write_model(tmp_path / "iter_0000020_hf", max_position_embeddings=16384)
    config = recipe(world)
    out = tmp_path / "eval"
    with pytest.raises(ConfigError) as error:
        evaluate(
            config,
            [Checkpoint("iter 20", small, "hf")],
            [{"input_messages": [], "label": "x"}],
            1,
            0.7,
            out,
            console=None,  # type: ignore[arg-type]  # never reached
        )
    message = error.value.message
    assert message.startswith("slime.rollout.max_context_len: 32768")
    assert "SGLang serves 16384" in message
    assert not (out / "logs").exists()  # no service was started
