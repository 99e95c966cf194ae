"""The rollout's settings: read from slime's args, then the environment, validated once."""

from __future__ import annotations

import json
from argparse import Namespace
from typing import Any

import pytest

from deepdive.rollout_settings import settings_from_args
from services.exceptions import ConfigError


def make_args(**extra: Any) -> Namespace:
    return Namespace(
        deepdive_sglang_url="http://127.0.0.1:1",
        deepdive_tool_server_url="http://127.0.0.1:2",
        deepdive_reward_server_url="http://127.0.0.1:3",
        **extra,
    )


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
