"""The rollout's settings: read from slime's args, then the environment, validated once."""

from __future__ import annotations

import importlib
import json
from argparse import Namespace
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from deepdive.rollout import generate_with_tool, reward_func
from deepdive.rollout_settings import (
    GENERATE_FUNCTION_PATH,
    REWARD_FUNCTION_PATH,
    RolloutSettings,
    arg_name,
    endpoint_base,
    settings_from_args,
)
from services.base.errors import ConfigError


def make_args(**extra: Any) -> Namespace:
    urls = {
        "deepdive_sglang_url": "http://127.0.0.1:1",
        "deepdive_tool_server_url": "http://127.0.0.1:2",
        "deepdive_reward_server_url": "http://127.0.0.1:3",
    }
    return Namespace(**{**urls, **extra})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"deepdive_max_turns": 0}, "deepdive_max_turns"),
        ({"deepdive_on_malformed": "ignore"}, "deepdive_on_malformed"),
        ({"deepdive_tool_server_url": None}, "deepdive_tool_server_url"),
        ({"deepdive_retries": -1}, "deepdive_retries"),
        ({"deepdive_max_turns": "many"}, "deepdive_max_turns"),
    ],
)
def test_settings_are_validated_once_with_the_key_named(
    override: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEEPDIVE_TOOL_SERVER_URL", raising=False)
    args = make_args()
    for key, value in override.items():
        setattr(args, key, value)
    with pytest.raises(ConfigError, match=message):
        settings_from_args(args)


def test_settings_fall_back_to_slime_args_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPDIVE_TOOL_SERVER_URL", "http://10.0.0.5:8700")
    monkeypatch.setenv("DEEPDIVE_REWARD_SERVER_URL", "http://10.0.0.5:8701")
    monkeypatch.setenv("DEEPDIVE_MAX_TURNS", "12")
    args = Namespace(
        sglang_router_ip="10.0.0.1", sglang_router_port=30000, rollout_max_context_len=8192
    )
    settings = settings_from_args(args)
    assert (settings.sglang_url, settings.max_turns, settings.max_context_tokens) == (
        "http://10.0.0.1:30000",
        12,
        8192,
    )
    assert settings_from_args(args) is settings  # validated once
    assert json.dumps(settings.tool_server_url) == '"http://10.0.0.5:8700"'


@pytest.mark.parametrize(
    ("key", "given", "base"),
    [
        ("tool_server_url", "http://h:8700/tool", "http://h:8700"),
        ("tool_server_url", "http://h:8700/tool/", "http://h:8700"),
        ("tool_server_url", "https://h/api/tool", "https://h/api"),
        ("reward_server_url", "http://h:8701/evaluate", "http://h:8701"),
        ("reward_server_url", "http://h:8701/evaluate/batch", "http://h:8701"),
        ("reward_server_url", "http://h:8701/evaluate/", "http://h:8701"),
        # strict: only the exact trailing segments of that service, else kept as given
        ("tool_server_url", "http://h:8700", "http://h:8700"),
        ("tool_server_url", "http://h:8700/", "http://h:8700/"),
        ("tool_server_url", "http://h:8700/tools", "http://h:8700/tools"),
        ("tool_server_url", "http://h:8700/mytool", "http://h:8700/mytool"),
        ("tool_server_url", "http://h:8700/tool/x", "http://h:8700/tool/x"),
        ("tool_server_url", "http://h:8700/evaluate", "http://h:8700/evaluate"),
        ("tool_server_url", "http://h:8700/tool?x=1", "http://h:8700/tool?x=1"),
        ("reward_server_url", "http://h:8701/tool", "http://h:8701/tool"),
        ("reward_server_url", "http://h:8701/evaluation", "http://h:8701/evaluation"),
        ("reward_server_url", "http://h:8701/batch", "http://h:8701/batch"),
        ("sglang_url", "http://h:30000/tool", "http://h:30000/tool"),
    ],
)
def test_a_service_url_may_name_its_endpoint(key: str, given: str, base: str) -> None:
    assert endpoint_base(key, given) == base


def test_deepdive_spellings_of_the_urls_are_read_as_base_urls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DeepDive's own environment names the endpoints; ours the base URLs: both work.
    monkeypatch.setenv("DEEPDIVE_TOOL_SERVER_URL", "http://10.0.0.5:8700/tool")
    monkeypatch.setenv("DEEPDIVE_REWARD_SERVER_URL", "http://10.0.0.5:8701/evaluate")
    settings = settings_from_args(Namespace(deepdive_sglang_url="http://10.0.0.1:30000"))
    assert (settings.tool_server_url, settings.reward_server_url) == (
        "http://10.0.0.5:8700",
        "http://10.0.0.5:8701",
    )
    from_args = settings_from_args(
        make_args(deepdive_reward_server_url="http://10.0.0.5:8701/evaluate/batch")
    )
    assert from_args.reward_server_url == "http://10.0.0.5:8701"
    assert from_args.tool_server_url == "http://127.0.0.1:2"


def test_the_custom_config_yaml_slime_loads_gives_back_the_same_settings(tmp_path: Path) -> None:
    # slime/utils/arguments.py:2013-2019 (624b824): with --custom-config-path, slime reads the
    # file with yaml.safe_load and setattr()s every key on args; the hook then reads them here.
    written = RolloutSettings(
        sglang_url="http://10.0.0.1:30000",
        tool_server_url="http://10.0.0.1:8700",
        reward_server_url="http://10.0.0.1:8701",
        max_turns=12,
        on_malformed="continue",
        retries=0,
    )
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(written.as_args()))
    args = Namespace(custom_config_path=str(path))
    for key, value in (yaml.safe_load(path.read_text()) or {}).items():
        setattr(args, key, value)
    assert settings_from_args(args) == written
    assert set(written.as_args()) == {arg_name(f.name) for f in fields(RolloutSettings)}


@pytest.mark.parametrize(
    ("path", "function"),
    [(GENERATE_FUNCTION_PATH, generate_with_tool), (REWARD_FUNCTION_PATH, reward_func)],
)
def test_the_hook_paths_resolve_as_slime_loads_them(path: str, function: object) -> None:
    # slime/utils/misc.py:39-47 (624b824): load_function rpartitions at the last dot, imports
    # the module and takes the attribute; slime/rollout/sglang_rollout.py:252 and
    # slime/rollout/rm_hub/__init__.py:61-62 call it with these paths.
    module_path, _, attribute = path.rpartition(".")
    assert getattr(importlib.import_module(module_path), attribute) is function


@pytest.mark.parametrize(
    "given",
    [
        "http://10.0.0.1:20010,http://10.0.0.1:20011",
        " http://10.0.0.1:20010 , http://10.0.0.1:20011",
        ["http://10.0.0.1:20010", "http://10.0.0.1:20011"],  # a YAML list
    ],
)
def test_a_tool_server_of_several_workers_is_a_comma_separated_list_or_a_list(
    given: object, tmp_path: Path
) -> None:
    settings = settings_from_args(make_args(deepdive_tool_server_url=given))
    urls = ("http://10.0.0.1:20010", "http://10.0.0.1:20011")
    assert settings.tool_server_urls == urls
    # written one way (the comma form), read back the same through slime's YAML
    assert settings.as_args()["deepdive_tool_server_url"] == ",".join(urls)
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(settings.as_args()))
    assert settings_from_args(Namespace(**yaml.safe_load(path.read_text()))) == settings


def test_one_tool_server_url_reads_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPDIVE_TOOL_SERVER_URL", "http://10.0.0.5:8700,http://10.0.0.5:8701")
    args = Namespace(deepdive_sglang_url="http://a:1", deepdive_reward_server_url="http://b:2")
    assert settings_from_args(args).tool_server_urls == (
        "http://10.0.0.5:8700",
        "http://10.0.0.5:8701",
    )
    single = settings_from_args(make_args())
    assert (single.tool_server_url, single.tool_server_urls) == (
        "http://127.0.0.1:2",
        ("http://127.0.0.1:2",),
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("http://a:1,ftp://b:2", "URL 2 of 2: expected an http(s) URL, got 'ftp://b:2'"),
        ("http://a:1,", "URL 2 of 2: expected an http(s) URL, got ''"),
        (["http://a:1", 3, "http://c:3"], "URL 2 of 3: expected an http(s) URL, got 3"),
        ([], "expected an http(s) URL or several, got []"),
        ("http://a:1,http://a:1", "the same URL is listed twice in 'http://a:1,http://a:1'"),
        ("a:1", "expected an http(s) URL, got 'a:1'"),
    ],
)
def test_a_bad_url_in_the_list_is_named(given: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings_from_args(make_args(deepdive_tool_server_url=given))
    assert error.value.message == f"deepdive_tool_server_url: {message}"


NODE_0 = ("http://10.0.0.1:20010", "http://10.0.0.1:20011")
NODE_1 = ("http://10.0.0.2:20010", "http://10.0.0.2:20011")


@pytest.mark.parametrize(
    "given",
    [
        ",".join(NODE_0) + ";" + ",".join(NODE_1),
        " http://10.0.0.1:20010/tool, http://10.0.0.1:20011 ;http://10.0.0.2:20010,http://10.0.0.2:20011",
        [list(NODE_0), list(NODE_1)],  # a YAML list of lists
        [",".join(NODE_0), list(NODE_1)],  # nodes in the comma form and as lists
    ],
)
def test_every_nodes_tool_server_workers_are_read_node_by_node(
    given: object, tmp_path: Path
) -> None:
    settings = settings_from_args(
        make_args(
            deepdive_tool_server_url=given,
            deepdive_reward_server_url=["http://10.0.0.1:20020", "http://10.0.0.2:20020/evaluate"],
        )
    )
    assert settings.tool_server_nodes == (NODE_0, NODE_1)
    assert settings.tool_server_urls == NODE_0 + NODE_1
    assert settings.reward_server_urls == ("http://10.0.0.1:20020", "http://10.0.0.2:20020")
    # one spelling, read back the same through slime's YAML
    assert settings.as_args()["deepdive_tool_server_url"] == ",".join(NODE_0) + ";" + ",".join(
        NODE_1
    )
    assert settings.as_args()["deepdive_reward_server_url"] == (
        "http://10.0.0.1:20020,http://10.0.0.2:20020"
    )
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(settings.as_args()))
    assert settings_from_args(Namespace(**yaml.safe_load(path.read_text()))) == settings


@pytest.mark.parametrize(
    ("key", "given", "message"),
    [
        (
            "tool_server_url",
            "http://a:1;ftp://b:2",
            "node 2 of 2: expected an http(s) URL, got 'ftp://b:2'",
        ),
        (
            "tool_server_url",
            [["http://a:1"], ["http://b:2", 3]],
            "node 2 of 2: URL 2 of 2: expected an http(s) URL, got 3",
        ),
        ("tool_server_url", "http://a:1;", "node 2 of 2: expected an http(s) URL, got ''"),
        (
            "tool_server_url",
            [["http://a:1"], []],
            "node 2 of 2: expected an http(s) URL or several, got []",
        ),
        (
            "tool_server_url",
            "http://a:1,http://b:2;http://b:2",
            "the same URL is listed twice in 'http://a:1,http://b:2;http://b:2'",
        ),
        (
            "tool_server_url",
            ["http://a:1,http://b:2", "http://c:3"],
            "URL 1 of 2: one URL each, without ',' or ';' (they separate workers and nodes), "
            "got 'http://a:1,http://b:2'",
        ),
        (
            "reward_server_url",
            "http://a:1;http://b:2",
            "one URL each, without ',' or ';' (they separate workers and nodes), "
            "got 'http://a:1;http://b:2'",
        ),
        (
            "reward_server_url",
            "http://a:1,ftp://b",
            "URL 2 of 2: expected an http(s) URL, got 'ftp://b'",
        ),
    ],
)
def test_a_bad_node_is_named(key: str, given: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings_from_args(make_args(**{arg_name(key): given}))
    assert error.value.message == f"{arg_name(key)}: {message}"
