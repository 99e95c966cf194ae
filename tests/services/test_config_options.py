"""A service's config as a TOML file of its own dataclass, and the options generated from its
fields (services/base/config_options.py): one declaration of each key, its type and default."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

import pytest

from services.base.config_options import (
    add_config_options,
    config_from_options,
    config_table,
    config_text,
)
from services.base.errors import ConfigError
from services.base.logs import register_secret
from services.reward_server.config import RewardServerConfig
from services.serving.connections import ConnectionLimits
from services.serving.supervision import SupervisionPolicy
from services.tool_server.config import ToolServerConfig


def read(*arguments: str) -> ToolServerConfig:
    parser = argparse.ArgumentParser()
    add_config_options(parser, ToolServerConfig())
    return config_from_options(parser.parse_args(list(arguments)), ToolServerConfig())


def test_no_file_and_no_option_is_the_defaults() -> None:
    assert read() == ToolServerConfig()


def test_every_field_is_an_option_nested_tables_after_a_dot() -> None:
    parser = argparse.ArgumentParser()
    add_config_options(parser, ToolServerConfig())
    text = parser.format_help()
    for option in (
        "--search",
        "--page-chars",
        "--serper.base-url",
        "--serper.retry.max-attempts",
        "--search-cache.enabled",
        "--connections.max-connections",
        "--supervision.ping-interval-s",
        "--blocked-domains",
    ):
        assert option in text, option


def test_the_file_and_the_options_on_top_of_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "tools.toml"
    path.write_text(
        'search = "serper"\npage_chars = 4000\nblocked_domains = ["a.org"]\n'
        "[serper]\nmax_concurrency = 7\n[supervision]\nmissed_pings = 5\n"
    )
    config = read("--config", str(path), "--page-chars", "5000", "--blocked-domains", "b.org",
                  "--connections.max-connections", "99", "--search-cache.enabled", "false",
                  "--corpus", str(path))  # fmt: skip
    defaults = ToolServerConfig()
    assert (config.search, config.page_chars, config.blocked_domains) == (
        "serper",
        5000,
        ("b.org",),
    )
    assert config.serper.max_concurrency == 7  # on top of the default upstream: its URL stays
    assert config.serper.base_url == defaults.serper.base_url
    assert config.supervision == SupervisionPolicy(missed_pings=5)
    assert config.connections == ConnectionLimits(max_connections=99)
    assert not config.search_cache.enabled and config.page_cache.enabled
    assert config.corpus == path  # a path field holds a Path


def test_an_unknown_key_names_the_file_and_suggests_the_field(tmp_path: Path) -> None:
    path = tmp_path / "tools.toml"
    path.write_text("[serper]\nmax_concurency = 4\n")
    with pytest.raises(ConfigError) as error:
        read("--config", str(path))
    assert error.value.message.startswith(f"{path}: [serper]: unknown key 'max_concurency'")
    assert error.value.message.endswith("did you mean 'max_concurrency'?")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("--page-chars", "many"), "page_chars: expected an integer, got a string 'many'"),
        (("--connections.max-connections", "0"), "connections.max_connections: expected a pos"),
        (("--supervision.missed-pings", "0"), "supervision.missed_pings: expected a whole"),
        (("--search", "bing"), "search: expected one of 'offline', 'serper', 'serpapi'"),
    ],
)
def test_a_bad_value_names_the_option_and_the_key(arguments: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        read(*arguments)
    assert error.value.message.startswith(f"the command line with {arguments[0]}: ")
    assert message in error.value.message


def test_the_table_a_launcher_writes_is_what_differs_and_reads_back(tmp_path: Path) -> None:
    config = RewardServerConfig(judge="openai", connections=ConnectionLimits(body_timeout=5.0))
    table = config_table(config, RewardServerConfig())
    assert table == {"judge": "openai", "connections": {"body_timeout": 5.0}}
    path = tmp_path / "reward.toml"
    path.write_text(config_text(table))
    assert tomllib.loads(path.read_text()) == table
    parser = argparse.ArgumentParser()
    add_config_options(parser, RewardServerConfig())
    args = parser.parse_args(["--config", str(path)])
    assert config_from_options(args, RewardServerConfig()) == config


def test_a_config_file_never_holds_a_secret() -> None:
    secret = "sk-a-judge-key-that-must-stay-in-the-environment"
    register_secret(secret)
    with pytest.raises(ConfigError, match="keys come from the environment only"):
        config_text({"judge_upstream": {"base_url": f"https://{secret}@judge.example/v1"}})
    assert secret not in config_text({"judge": "openai"})
