"""`deepdive run`'s TOML config: defaults, and errors that name the key and what it expects."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from deepdive.local.config import LocalRunConfig, load_local_config
from deepdive.local.rollouts import settings_for
from deepdive.rollout_settings import RolloutKnobs
from services.base.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "configs" / "local.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def test_the_shipped_config_loads() -> None:
    config = load_local_config(ROOT / "configs" / "local.toml")
    assert isinstance(config, LocalRunConfig)
    assert config.grpo.samples_per_prompt >= 2  # a group needs company to have an advantage


def test_the_defaults_are_the_shipped_recipe() -> None:
    """`deepdive run` without a file must train what configs/local.toml documents: one recipe,
    not a file and a second, stale one in the dataclass defaults."""
    assert load_local_config(SHIPPED) == LocalRunConfig()
    assert load_local_config(None) == LocalRunConfig()


def test_the_shipped_config_writes_out_every_field_of_every_table() -> None:
    """A reader of configs/local.toml sees the whole recipe: no field is left to a default the
    file does not show, and no key in it is one the loader would refuse."""
    written = tomllib.loads(SHIPPED.read_text(encoding="utf-8"))
    defaults = LocalRunConfig()
    tables = {table.name: getattr(defaults, table.name) for table in fields(defaults)}
    assert set(written) == set(tables)
    knobs = {item.name for item in fields(RolloutKnobs)}  # declared once, not restated
    for name, section in tables.items():
        assert is_dataclass(section)
        shown = {item.name for item in fields(section)} - (knobs if name == "rollout" else set())
        assert set(written[name]) == shown, name


def test_the_shipped_config_restates_no_rollout_knob() -> None:
    """The knobs' defaults live in RolloutKnobs alone: a file that restates one keeps a second
    copy that goes stale when the default moves (configs/deepdive-qwen.toml: tests/slurm)."""
    written = tomllib.loads(SHIPPED.read_text(encoding="utf-8"))
    knobs = {item.name for item in fields(RolloutKnobs)}
    assert not knobs & set(written["rollout"])


def test_values_are_read_and_ints_count_as_floats(tmp_path: Path) -> None:
    config = load_local_config(
        write(tmp_path, '[grpo]\nlr = 1\nsteps = 3\n[rollout]\non_malformed = "continue"\n')
    )
    assert config.grpo.lr == 1.0 and isinstance(config.grpo.lr, float)
    assert config.grpo.steps == 3 and config.rollout.on_malformed == "continue"
    assert config.warm_start == LocalRunConfig().warm_start


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[grpo]\nlrr = 0.1\n", "[grpo]: unknown key 'lrr' (expected one of: steps, "),
        ("[gpro]\nlr = 0.1\n", "the top level: unknown key 'gpro'"),
        ('[grpo]\nsteps = "ten"\n', "grpo.steps: expected an integer, got a string 'ten'"),
        ("[grpo]\nsteps = 2.5\n", "grpo.steps: expected an integer, got a number 2.5"),
        ("[grpo]\nnormalize_std = 1\n", "grpo.normalize_std: expected true or false, got an"),
        ("[grpo]\nlr = true\n", "grpo.lr: expected a number, got a boolean True"),
        ('[rollout]\non_malformed = "retry"\n', "expected one of 'fail', 'continue'"),
        ("grpo = 3\n", "[grpo]: expected a table, got an integer"),
        ("[grpo]\nsamples_per_prompt = 0\n", "grpo.samples_per_prompt: expected at least 1"),
        (
            "[warm_start]\nobservation_weight = 1.5\n",
            "warm_start.observation_weight: expected in [0, 1]",
        ),
        ("[grpo]\nupdates_per_step = 3\n", "grpo.updates_per_step: expected a divisor of"),
        ("[world]\nsft_worlds = -1\n", "world.sft_worlds: expected 0 (this world) or more"),
        ("[world]\nsft_questions = 0\n", "world.sft_questions: expected at least 1"),
        ("[eval]\nunseen_questions = -2\n", "eval.unseen_questions: expected 0 (off) or more"),
        ('[model]\npath = "/nonexistent/model"\n', "model.path: expected a Hugging Face model"),
        ("[grpo\n", "not valid TOML"),
    ],
)
def test_bad_config_fails_with_the_key_and_the_expected_value(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_local_config(path)
    assert message in caught.value.message
    assert caught.value.message.startswith(str(path))


def test_the_local_rollout_plays_with_its_tables_knobs() -> None:
    """[rollout]'s timeouts and retries reach the rollout (it had none: the hook's own
    defaults applied whatever the file said)."""
    config = load_local_config(
        None, ["rollout.tool_timeout_s=7", "rollout.retries=0", "rollout.generate_timeout_s=9"]
    )
    settings = settings_for(config, "http://engine:1", ("http://tools:2",), "http://reward:3")
    assert (settings.tool_timeout_s, settings.generate_timeout_s, settings.retries) == (7, 9, 0)
    assert (settings.max_turns, settings.max_context_tokens) == (64, 2048)
    assert settings.tool_server_url == (("http://tools:2",),)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_local_config(tmp_path / "absent.toml")


def test_the_command_fails_fast_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[grpo]\nclip_lowww = 0.2\n")
    result = subprocess.run(
        [sys.executable, "-m", "slurm.cli", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"deepdive: error: {path}: [grpo]: unknown key 'clip_lowww' (expected one of: "
        "steps, prompts_per_step, samples_per_prompt, lr, normalize_std, clip_low, clip_high, "
        "kl_coef, max_grad_norm, weight_decay, per_token_loss, updates_per_step, micro_batch); "
        "did you mean 'clip_low'?"
    ]
    assert not (tmp_path / "runs").exists()  # nothing started


def test_overrides_from_the_command_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[grpo]\nsteps = 3\n")
    config = load_local_config(path, ["grpo.steps=7", "run.out=runs/b", "run.seed = 4"])
    assert (config.grpo.steps, config.run.out, config.run.seed) == (7, "runs/b", 4)
    assert load_local_config(None, ["eval.before=false"]).eval.before is False
    with pytest.raises(
        ConfigError, match=re.escape("grpo.steps: expected an integer, got a string 'many'")
    ):
        load_local_config(path, ["grpo.steps=many"])
    with pytest.raises(ConfigError, match=re.escape("--set grpo: expected table.key=value")):
        load_local_config(path, ["grpo"])
    with pytest.raises(ConfigError, match="unknown key 'stepz'"):
        load_local_config(None, ["grpo.stepz=1"])


def test_a_world_too_small_for_the_warm_start_is_an_error_before_training(tmp_path: Path) -> None:
    """The held-out and RL questions take the whole question space of this world: no question
    is left to demonstrate, which would otherwise be a warm start of zero steps."""
    from deepdive.local.data import prepare_data
    from deepdive.run_paths import RunPaths

    sizes = "people = 6\ncities = 3\nguilds = 2\nartifacts = 4\nmax_hops = 1\n"
    text = f"[world]\n{sizes}eval_questions = 10\ntrain_questions = 1000\n"
    config = load_local_config(write(tmp_path, text))
    with pytest.raises(ConfigError, match="this world has no demonstration for the warm start"):
        prepare_data(config, RunPaths(tmp_path / "run"))
    # without a warm start the same world runs: the RL and held-out questions are there
    no_warm_start = load_local_config(write(tmp_path, text + "[warm_start]\nepochs = 0\n"))
    manifest = prepare_data(no_warm_start, RunPaths(tmp_path / "run"))
    assert manifest["demonstrations"] == 0 and manifest["train"] and manifest["eval"] == 10
