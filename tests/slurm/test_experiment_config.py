"""`deepdive submit`'s experiment file: checked whole before anything is submitted, each error
naming the key and what it expects (as the CLI prints it: one line, exit code 2)."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import tomllib
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest

from deepdive.rollout_settings import RolloutKnobs, settings_from_args
from services.base.errors import ConfigError
from slurm.config import ExperimentConfig, load_experiment, local_run_config
from slurm.launch.preflight import missing_inputs, require_inputs
from tests.helpers import DEEPDIVE

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "configs" / "cluster-local.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "experiment.toml"
    path.write_text(f'[run]\nfolder = "{tmp_path / "run"}"\n' + text)
    return path


def test_the_shipped_experiment_loads_with_absolute_paths() -> None:
    config = load_experiment(SHIPPED)
    assert isinstance(config, ExperimentConfig)
    assert Path(config.run.folder).is_absolute() and config.run.folder.endswith(
        "runs/cluster-local"
    )
    assert config.slurm.nodes == 2 and config.run.backend == "local"
    assert local_run_config(config).run.out == config.run.folder  # the backend writes there


def test_both_backends_take_the_rollouts_knobs_with_one_set_of_defaults() -> None:
    """[slime.deepdive], [local.rollout] and what the hook reads when slime's args do not
    say: the same keys, the same defaults (they were 300 s and 5 retries, no key at all, and
    120 s and 3 retries)."""
    config = ExperimentConfig()
    slime = dataclasses.asdict(config.slime.deepdive)
    local = dataclasses.asdict(config.local.rollout)
    assert {key: local.get(key) for key in slime} == slime
    read = settings_from_args(
        Namespace(
            deepdive_sglang_url="http://sglang:1",
            deepdive_tool_server_url=[["http://tool_server:1"]],
            deepdive_reward_server_url=["http://r:1"],
        )
    )
    assert {key: getattr(read, key) for key in slime} == slime


def test_each_service_runs_with_the_config_its_table_gives(tmp_path: Path) -> None:
    """[services.tools] and [services.reward] become the services' own config files on the
    node (the slime backend's), which their own commands read as the table said."""
    from services.reward_server import command as reward_command
    from services.tool_server import command as tool_command
    from slurm.backends import build_backend

    text = (  # `backend` goes into the [run] table `write` opens
        'backend = "slime"\n[services.tools]\nsearch = "serper"\nreader = "jina"\n'
        'blocked_domains = ["a.org", "b.org"]\ncall_deadline_s = 30\n'
        "[services.tools.search_cache]\nenabled = false\n"
        '[services.reward]\njudge = "openai"\njudge_model = "gpt-4o-mini"\n'
    )
    config = load_experiment(write(tmp_path, text))
    specs = {spec.name: spec for spec in build_backend(config).services()}

    def parsed(name: str, module: Any) -> Any:
        parser = argparse.ArgumentParser()
        module.add_arguments(parser)
        file = specs[name].write_config(tmp_path / "node-0")
        arguments = specs[name].command_arguments(2, file)
        assert arguments[:3] == [name, "--config", str(file)]
        return module.config_from_args(parser.parse_args(arguments[1:]))

    tools = parsed("tools", tool_command)
    assert (tools.search, tools.reader, tools.blocked_domains) == (
        "serper",
        "jina",
        ("a.org", "b.org"),
    )
    assert (tools.search_cache.enabled, tools.call_deadline_s) == (False, 30.0)
    assert tools.page_cache.enabled  # what the table does not say is the default
    reward = parsed("reward", reward_command)
    assert (reward.judge, reward.judge_model) == ("openai", "gpt-4o-mini")
    # a path is taken from where you submit, as the experiment's others
    here = load_experiment(write(tmp_path, '[services.tools]\ncorpus = "pages.jsonl"\n'))
    assert here.services.tools["corpus"] == str(Path.cwd() / "pages.jsonl")


def test_the_slime_recipe_restates_no_default_of_the_knobs_or_the_services() -> None:
    """configs/deepdive-qwen.toml sets a rollout knob or a service's key only to change it: the
    defaults live once, in RolloutKnobs, ServicesTable and the services' config dataclasses."""
    from services.commands import service_defaults
    from slurm.config import ServicesTable

    recipe = ROOT / "configs" / "deepdive-qwen.toml"
    written = tomllib.loads(recipe.read_text(encoding="utf-8"))
    services = written.get("services", {})
    restated = [
        f"slime.deepdive.{key}"
        for key, value in written["slime"].get("deepdive", {}).items()
        if getattr(RolloutKnobs(), key) == value
    ]
    restated += [
        f"services.{key}"
        for key, value in services.items()
        if not isinstance(value, dict) and getattr(ServicesTable(), key) == value
    ]
    for name in ("tools", "reward"):
        defaults = service_defaults(name)
        restated += [
            f"services.{name}.{key}"
            for key, value in services.get(name, {}).items()
            if not isinstance(value, dict) and getattr(defaults, key) == value
        ]
    assert not restated


def test_overrides_reach_nested_tables(tmp_path: Path) -> None:
    config = load_experiment(
        write(tmp_path, ""),
        ["slurm.nodes=4", "local.grpo.steps=3", 'slurm.extra={"mail-type"="END"}'],
    )
    assert config.slurm.nodes == 4 and config.local.grpo.steps == 3
    assert config.slurm.extra == {"mail-type": "END"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[slurm]\nnodse = 2\n", "unknown key 'nodse'"),
        ('[slurm]\nnodes = "two"\n', "slurm.nodes: expected an integer, got a string 'two'"),
        ("[slurm]\nnodes = 0\n", "slurm.nodes: expected at least 1"),
        (
            "[slurm]\ntime_min = 1\nsignal_delay_s = 90\n",
            "slurm.signal_delay_s: expected less than the time limit (60 s)",
        ),
        (
            '[slurm]\nextra = { output = "x" }\n',
            "slurm.extra.output: expected an option the launcher does not set itself",
        ),
        (
            "[slurm]\nextra = { mail-type = 3 }\n",
            "slurm.extra: expected a table of key = value (a string each)",
        ),
        (
            "[services]\ntool_workers = 15\n",
            "services.tool_workers: expected 0 (one per CPU of the task) to 14 (the ports a "
            "node keeps for them), got 15",
        ),
        ("[services]\ntool_workers = -1\n", "services.tool_workers: expected 0 (one per CPU"),
        ('[local.run]\nout = "elsewhere"\n', "local.run.out: expected left unset"),
        ("[local.grpo]\nlr = -1\n", "grpo.lr: expected a positive number"),
        ("[local.grpo]\nstepz = 1\n", "[local.grpo]: unknown key 'stepz'"),
        # the rollout's knobs: checked at load, under the key of the table that holds them
        (
            "[slime.deepdive]\ntool_timeout_s = 0\n",
            "slime.deepdive.tool_timeout_s: expected a positive number",
        ),
        ("[slime.deepdive]\nretries = -1\n", "slime.deepdive.retries: expected a whole number"),
        ("[local.rollout]\nreward_timeout_s = 0\n", "rollout.reward_timeout_s: expected a pos"),
        ("[local.rollout]\nmax_aborted_share = 2\n", "rollout.max_aborted_share: expected a"),
        # each service's config: read as the service reads its config file, at load
        (
            '[services.tools]\nsearch = "serpr"\n',
            "services.tools.search: expected one of 'offline', 'serper', 'serpapi', got a string",
        ),
        (
            '[services.tools]\nsearhc = "serper"\n',
            "[services.tools]: unknown key 'searhc' (expected one of: search, reader, ",
        ),
        (
            "[services.tools]\ncall_deadline_s = -1\n",
            "services.tools.call_deadline_s: expected a positive number",
        ),
        (
            "[services.tools.connections]\nmax_connections = 0\n",
            "services.tools.connections.max_connections: expected a positive whole number",
        ),
        (
            "[services.tools.serper]\nmax_concurrency = 0\n",
            "services.tools.serper.max_concurrency: expected a positive number",
        ),
        ("[services.tools]\nport = 8700\n", "services.tools.port: set by the launcher (the n"),
        (
            '[services.tools.search_cache]\nenabled = "yes"\n',
            "services.tools.search_cache.enabled: expected true or false, got a string 'yes'",
        ),
        ('[services.tools]\ngl = ["us", "de"]\n', "services.tools.gl: expected a string, got a"),
        (
            '[services.reward]\njudge = "gpt"\n',
            "services.reward.judge: expected one of 'rule', 'openai', got a string 'gpt'",
        ),
        ('[services]\ntools = ["--serch", "serper"]\n', "services.tools: expected a table"),
        ("[run]\n", "Cannot declare"),  # a table written twice is not TOML
        (  # no SLURM_* inside the image: submitit cannot run (seen on the 2-host cluster)
            '[container]\noptions = ["--containall"]\n',
            "container.options: expected no --containall or --cleanenv",
        ),
        ('[container]\noptions = ["-e"]\n', "container.options: expected no --containall"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_experiment(write(tmp_path, text))
    assert message in error.value.message
    assert str(tmp_path / "experiment.toml") in error.value.message


def test_a_missing_run_folder_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "e.toml"
    path.write_text('[run]\nname = "x"\n')
    with pytest.raises(ConfigError, match=r"run\.folder: expected a folder on shared storage"):
        load_experiment(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[container]\nimage = "/nowhere/x.sif"\n', "container.image: /nowhere/x.sif: no such"),
        (
            '[services]\nenv_file = "/nowhere/keys.env"\n',
            "services.env_file: env file /nowhere/keys.env: no such file",
        ),
        (
            'backend = "slime"\n[services.tools]\ncorpus = "/nowhere/corpus.jsonl"\n',
            "services.tools.corpus: /nowhere/corpus.jsonl: no such file",
        ),
    ],
)
def test_what_must_exist_is_listed_then_refused(tmp_path: Path, text: str, message: str) -> None:
    """The config loads (a dry run prints what would run); the submission refuses."""
    config = load_experiment(write(tmp_path, text))
    assert [item for item in missing_inputs(config) if message in item]
    with pytest.raises(ConfigError, match=message):
        require_inputs(config)


def test_an_env_file_others_can_read_is_refused_before_submission(tmp_path: Path) -> None:
    keys = tmp_path / "keys.env"
    keys.write_text("SERPER_API_KEY=secret-value-123\n")
    keys.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        require_inputs(load_experiment(write(tmp_path, f'[services]\nenv_file = "{keys}"\n')))


def test_the_cli_prints_one_line_and_submits_nothing(tmp_path: Path) -> None:
    result = subprocess.run(
        [*DEEPDIVE, "submit", str(write(tmp_path, "[slurm]\nnodes = -1\n"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("deepdive: error: ") and "slurm.nodes" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()  # nothing was created, nothing submitted


def test_services_for_other_nodes_need_the_token_named_in_the_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """host "node" serves the other nodes; without DEEPDIVE_SERVICE_TOKEN the services refuse
    to start, after the allocation: the submission says so first (from the file's names)."""
    monkeypatch.delenv("DEEPDIVE_SERVICE_TOKEN", raising=False)
    keys = tmp_path / "keys.env"
    keys.write_text("SERPER_API_KEY=secret-value-123\n")
    keys.chmod(0o600)
    text = f'[services]\nhost = "node"\nenv_file = "{keys}"\n'
    config = load_experiment(write(tmp_path, text))
    with pytest.raises(ConfigError, match=r"services\.host: 'node' serves the other nodes"):
        require_inputs(config)
    keys.write_text("SERPER_API_KEY=secret-value-123\nDEEPDIVE_SERVICE_TOKEN=t0k3n-value\n")
    require_inputs(config)
    local = load_experiment(write(tmp_path, '[services]\nhost = "127.0.0.1"\n'))
    require_inputs(local)


def test_a_config_naming_an_image_loads_where_the_image_is_not(tmp_path: Path) -> None:
    """The trainer reads the run's config.toml inside the image, where the image's own path is
    not bound (the 2-host container test met it: every containerised local run failed so)."""
    config = load_experiment(write(tmp_path, '[container]\nimage = "/nowhere/x.sif"\n'))
    assert config.container.image == "/nowhere/x.sif"


def test_the_services_proxy_is_a_host_and_port_never_a_password(tmp_path: Path) -> None:
    config = SHIPPED
    good = load_experiment(config, ['services.proxy="http://proxy.site.example:3128"'])
    assert good.services.proxy == "http://proxy.site.example:3128"
    secret = write(
        tmp_path, '[services]\nproxy = "http://agent:s3cret-pw@proxy.site.example:3128"\n'
    )
    with pytest.raises(ConfigError) as refused:
        load_experiment(secret)
    assert "services.proxy" in str(refused.value) and "env file" in str(refused.value)
    assert "s3cret-pw" not in str(refused.value)
    for bad in (
        "proxy.site.example:3128",
        "socks5://proxy:1080",
        "http://proxy:3128/path",
        "http://:80",
    ):
        with pytest.raises(ConfigError, match=r"services\.proxy"):
            load_experiment(config, [f'services.proxy="{bad}"'])


def test_the_services_proxy_keeps_loopback_and_the_sites_own_no_proxy_direct() -> None:
    services = load_experiment(SHIPPED, ['services.proxy="http://proxy:3128"']).services
    added = services.proxy_environment(
        {"NO_PROXY": ".cluster.internal, 10.0.0.0/8", "no_proxy": ""}
    )
    assert added["HTTPS_PROXY"] == added["https_proxy"] == "http://proxy:3128"
    assert added["HTTP_PROXY"] == added["http_proxy"] == "http://proxy:3128"
    assert added["NO_PROXY"] == added["no_proxy"]
    assert added["NO_PROXY"] == ".cluster.internal,10.0.0.0/8,localhost,127.0.0.1,::1"
    assert load_experiment(SHIPPED, []).services.proxy_environment({}) == {}
