"""The rollout's settings: read from slime's args, then the environment, validated once."""

from __future__ import annotations

import importlib
import json
from argparse import Namespace
from dataclasses import fields
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import yaml
from hypothesis import strategies as st

from deepdive.generate import generate_with_tool
from deepdive.reward import reward_func
from deepdive.rollout_settings import (
    GENERATE_FUNCTION_PATH,
    REWARD_FUNCTION_PATH,
    RolloutSettings,
    arg_name,
    env_name,
    settings_from_args,
)
from deepdive.service_urls import endpoint_base, nodes_from_text, urls_from_text
from services.base.errors import ConfigError


def make_args(**extra: Any) -> Namespace:
    urls = {
        "deepdive_sglang_url": "http://127.0.0.1:1",
        "deepdive_tool_server_url": [["http://127.0.0.1:2"]],
        "deepdive_reward_server_url": ["http://127.0.0.1:3"],
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
    assert json.dumps(settings.tool_server_url) == '[["http://10.0.0.5:8700"]]'


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
        (("http://10.0.0.5:8700",),),
        ("http://10.0.0.5:8701",),
    )
    from_args = settings_from_args(
        make_args(
            deepdive_tool_server_url=[["http://127.0.0.1:2/tool"]],
            deepdive_reward_server_url=["http://10.0.0.5:8701/evaluate/batch"],
        )
    )
    assert from_args.reward_server_url == ("http://10.0.0.5:8701",)
    assert from_args.tool_server_url == (("http://127.0.0.1:2",),)


def test_the_custom_config_yaml_slime_loads_gives_back_the_same_settings(tmp_path: Path) -> None:
    # slime/utils/arguments.py:2013-2019 (624b824): with --custom-config-path, slime reads the
    # file with yaml.safe_load and setattr()s every key on args; the hook then reads them here.
    written = RolloutSettings(
        sglang_url="http://10.0.0.1:30000",
        tool_server_url=(("http://10.0.0.1:8700", "http://10.0.0.1:8710"),),
        reward_server_url=("http://10.0.0.1:8701",),
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


NODE_0 = ("http://10.0.0.1:20010", "http://10.0.0.1:20011")
NODE_1 = ("http://10.0.0.2:20010", "http://10.0.0.2:20011")
REWARDS = ("http://10.0.0.1:20020", "http://10.0.0.2:20020")


def test_the_yaml_holds_the_urls_as_lists_and_reads_them_back(tmp_path: Path) -> None:
    """What slime's YAML carries: the tool server's nodes as a list of lists of URLs, the
    reward servers as a list (no joined string to split again)."""
    settings = settings_from_args(
        make_args(
            deepdive_tool_server_url=[list(NODE_0), [f"{NODE_1[0]}/tool", NODE_1[1]]],
            deepdive_reward_server_url=[REWARDS[0], f"{REWARDS[1]}/evaluate"],
        )
    )
    assert (settings.tool_server_nodes, settings.reward_server_urls) == ((NODE_0, NODE_1), REWARDS)
    assert settings.tool_server_urls == NODE_0 + NODE_1
    path = tmp_path / "custom.yaml"
    path.write_text(yaml.safe_dump(settings.as_args()))
    written = yaml.safe_load(path.read_text())
    assert written["deepdive_tool_server_url"] == [list(NODE_0), list(NODE_1)]
    assert written["deepdive_reward_server_url"] == list(REWARDS)
    assert settings_from_args(Namespace(**written)) == settings


@pytest.mark.parametrize(
    ("tools", "nodes"),
    [
        ("http://10.0.0.1:20010", (("http://10.0.0.1:20010",),)),  # one node of one worker
        (",".join(NODE_0), (NODE_0,)),
        (",".join(NODE_0) + ";" + ",".join(NODE_1), (NODE_0, NODE_1)),
        (
            " http://10.0.0.1:20010/tool , http://10.0.0.1:20011;" + ",".join(NODE_1),
            (NODE_0, NODE_1),
        ),
    ],
)
def test_the_environment_fallback_spells_the_nodes_as_one_string(
    tools: str, nodes: tuple[tuple[str, ...], ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEEPDIVE_TOOL_SERVER_URL", tools)
    monkeypatch.setenv("DEEPDIVE_REWARD_SERVER_URL", ",".join(REWARDS))
    settings = settings_from_args(Namespace(deepdive_sglang_url="http://a:1"))
    assert (settings.tool_server_nodes, settings.reward_server_urls) == (nodes, REWARDS)
    assert nodes_from_text("tool_server_url", tools) == nodes


@pytest.mark.parametrize(
    ("key", "given", "message"),
    [
        (
            "tool_server_url",
            "http://a:1,http://b:2;http://c:3",  # the environment's spelling, in the YAML
            "expected a list of nodes, each a list of its workers' http(s) URLs (a string only "
            "in DEEPDIVE_TOOL_SERVER_URL), got 'http://a:1,http://b:2;http://c:3'",
        ),
        (
            "tool_server_url",
            ["http://a:1", "http://b:2"],  # one node's workers, without the list of nodes
            "node 1 of 2: expected a list of http(s) URLs (a string only in "
            "DEEPDIVE_TOOL_SERVER_URL), got 'http://a:1'",
        ),
        (
            "tool_server_url",
            [],
            "expected a list of nodes, each a list of its workers' http(s) URLs, got []",
        ),
        (
            "tool_server_url",
            [["http://a:1"], ["http://b:2", 3]],
            "node 2 of 2: URL 2 of 2: expected an http(s) URL, got 3",
        ),
        (
            "tool_server_url",
            [["http://a:1"], []],
            "node 2 of 2: expected a list of http(s) URLs, got []",
        ),
        (
            "tool_server_url",
            [["http://a:1", "http://b:2"], ["http://b:2"]],
            "the same URL is listed twice in [['http://a:1', 'http://b:2'], ['http://b:2']]",
        ),
        (
            "tool_server_url",
            [["http://a:1,http://b:2"]],
            "node 1 of 1: URL 1 of 1: one URL each, without ',' or ';' (a list holds several), "
            "got 'http://a:1,http://b:2'",
        ),
        (
            "reward_server_url",
            "http://a:1",
            "expected a list of http(s) URLs (a string only in DEEPDIVE_REWARD_SERVER_URL), "
            "got 'http://a:1'",
        ),
        (
            "reward_server_url",
            ["http://a:1", "ftp://b"],
            "URL 2 of 2: expected an http(s) URL, got 'ftp://b'",
        ),
        (
            "reward_server_url",
            ["http://a:1", "http://a:1"],
            "the same URL is listed twice in ['http://a:1', 'http://a:1']",
        ),
    ],
)
def test_a_malformed_list_is_named_with_its_key_and_what_was_expected(
    key: str, given: object, message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        settings_from_args(make_args(**{arg_name(key): given}))
    assert error.value.message == f"{arg_name(key)}: {message}"


@pytest.mark.parametrize(
    ("key", "given", "message"),
    [
        (
            "tool_server_url",
            "http://a:1;",
            "node 2 of 2: URL 1 of 1: expected an http(s) URL, got ''",
        ),
        (
            "tool_server_url",
            "http://a:1,ftp://b:2",
            "node 1 of 1: URL 2 of 2: expected an http(s) URL, got 'ftp://b:2'",
        ),
        (
            "tool_server_url",
            "http://a:1;http://a:1",
            "the same URL is listed twice in [['http://a:1'], ['http://a:1']]",
        ),
        (
            "reward_server_url",
            "http://a:1;http://b:2",
            "URL 1 of 1: one URL each, without ',' or ';' (a list holds several), "
            "got 'http://a:1;http://b:2'",
        ),
    ],
)
def test_a_malformed_environment_value_is_named(
    key: str, given: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_name(key), given)
    args = make_args()
    delattr(args, arg_name(key))
    with pytest.raises(ConfigError) as error:
        settings_from_args(args)
    assert error.value.message == f"{arg_name(key)}: {message}"


def parsed_or_error(field: str, text: str) -> tuple[str, ...]:
    """Every URL the environment's spelling of `text` gives, or () for a ConfigError, which
    names the setting."""
    try:
        if field == "tool_server_url":
            return tuple(url for node in nodes_from_text(field, text) for url in node)
        return urls_from_text(field, text)
    except ConfigError as error:
        assert error.message.startswith(arg_name(field) + ": ")
        return ()


# arbitrary text, and text made of the spelling's own pieces, so that many parse
PIECES = ["http://", "https://", "h:1", ",", ";", " ", "/tool", "/evaluate", "?", "#", "[", "%"]
ENV_TEXT = st.text() | st.lists(st.sampled_from(PIECES) | st.text(max_size=3)).map("".join)


@hypothesis.settings(max_examples=400, deadline=None)
@hypothesis.given(ENV_TEXT)
def test_the_environment_spelling_of_any_text_is_urls_or_a_config_error(text: str) -> None:
    """Only the project's ConfigError escapes, never a ValueError or IndexError of its own."""
    for field in ("tool_server_url", "reward_server_url"):
        urls = parsed_or_error(field, text)
        assert all(url.startswith(("http://", "https://")) for url in urls)
        assert all("," not in url and ";" not in url for url in urls)
