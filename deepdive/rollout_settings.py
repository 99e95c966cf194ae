"""Every knob of the rollout, declared once (`RolloutKnobs`, with its defaults and why), written
once (`as_args`), read once from slime's `args` (`settings_from_args`) and validated — the
`deepdive_*` keys are written and read here and nowhere else (deepdive.arg_names spells them).
The knobs are apart from where the services are: `RolloutSettings` is the knobs with the URLs
and the episode's context, built only where the URLs are known.

Inside slime the launcher writes `slime_custom_config` into a YAML file passed as
`--custom-config-path`; slime sets each key on `args`, and the rollout (running in slime's Ray
actors) reads them here. The local backend passes the same keys on a Namespace. An
environment variable is only a fallback, for running the hook by hand.

Where the services are (the tool server's nodes and workers, the reward servers', the one
string spelling of the environment fallback) is deepdive.service_urls: the URLs are checked
and read from `args` there, and carried here.
"""

from __future__ import annotations

import contextlib
import os
from argparse import Namespace
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

from deepdive.arg_names import PREFIX, arg_name, env_name
from deepdive.service_urls import (
    Nodes,
    check_url,
    checked_nodes,
    checked_urls,
    service_urls,
    urls_from_args,
)
from services.base.errors import ConfigError
from services.base.typed_config import positive

__all__ = [
    "EVAL_LOG_FUNCTION_PATH",
    "GENERATE_FUNCTION_PATH",
    "REWARD_FUNCTION_PATH",
    "REWARD_POST_PROCESS_PATH",
    "ROLLOUT_LOG_FUNCTION_PATH",
    "TOKENIZER_ARG",
    "TRAJECTORY_DIR_ARG",
    "RolloutKnobs",
    "RolloutSettings",
    "arg_name",
    "env_name",
    "rollout_args",
    "settings_from_args",
    "slime_custom_config",
    "trajectory_dir",
]

OnMalformed = Literal["fail", "continue"]

# What slime is told to call: --custom-generate-function-path and --custom-rm-path.
GENERATE_FUNCTION_PATH = "deepdive.generate.generate_with_tool"
REWARD_FUNCTION_PATH = "deepdive.reward.reward_func"
# ... and --custom-rollout-log-function-path, --custom-eval-rollout-log-function-path
ROLLOUT_LOG_FUNCTION_PATH = "deepdive.aborts.log_rollout"
EVAL_LOG_FUNCTION_PATH = "deepdive.aborts.log_eval_rollout"
# ... and --custom-reward-post-process-path: slime's group normalisation over answered episodes
REWARD_POST_PROCESS_PATH = "deepdive.group_rewards.post_process_rewards"
# The tokenizer object the local backend hands the rollout (slime's hook loads hf_checkpoint's).
TOKENIZER_ARG = "deepdive_tokenizer"
# Where the rollout log functions record episodes (RUN/trajectories): a key of the custom-config
# YAML the slime backend writes with the run folder; unset, nothing is recorded.
TRAJECTORY_DIR_ARG = "deepdive_trajectory_dir"


@dataclass(frozen=True)
class RolloutKnobs:
    """The rollout's knobs, declared once: `[slime.deepdive]` and `[local.rollout]` take these
    keys with these defaults, and the hook reads them from slime's `args` as `deepdive_KEY`.
    Each default, and why (DeepDive's recipe is training/rollout/deepdive_rollout.py and
    training/scripts/training/train_deepdive_slime.sh; a recipe file may set its own):

    max_turns           64, DeepDive's DEEPDIVE_MAX_TURNS: model turns at most; an episode
                        that reaches them ends TRUNCATED
    on_malformed        fail, DeepDive's DEEPDIVE_STOP_ONCE_ILLFORM=1: a malformed call ends the
                        episode FAILED; continue: show the model an error observation and let
                        it try again
    tool_timeout_s      300, DeepDive's DEEPDIVE_TOOL_TIMEOUT. DeepDive's bounds each attempt,
                        ours the whole call, retries included: the tool server answers within
                        its own deadline (ToolServerConfig.call_deadline_s, 60 s), so this only
                        bounds a server that is down or being restarted
    reward_timeout_s    600, DeepDive's DEEPDIVE_REWARD_TIMEOUT: one request (a group's batch
                        of judgements, or one sample's)
    generate_timeout_s  1800, ours (DeepDive leaves a turn to the router's 10-hour request
                        timeout): a turn of a long response on a busy engine takes minutes;
                        half an hour names a hung engine hours before the router would
    retries             4: DeepDive's DEEPDIVE_TOOL_MAX_RETRY=5 counts attempts
                        (`range(max_retry)`), this the retries after the first: the same five
                        attempts, of 429/5xx/transport errors, for each of the three services
    max_aborted_share   0.5, ours (DeepDive trains on an aborted episode as a wrong answer): a
                        rollout with more of its episodes ABORTED stops the run
                        (deepdive.aborts), since SGLang is failing, not the policy; 1 never
                        stops
    max_tool_error_share 0.5, ours (DeepDive turns a failed tool call into an observation and
                        trains on): a rollout with more of its tool calls (search, click,
                        open) failed by the infrastructure (deepdive.protocol.TOOL_ERROR_KINDS:
                        an upstream unavailable, a rate limit, a key refused, a deadline)
                        stops the run (deepdive.tool_errors); a compute node without internet
                        fails them all; 1 never stops
    trajectory_groups   4, ours: the groups of each training step whose episodes are recorded
                        to the run folder (deepdive.trajectory_recorder; an evaluation's are
                        all recorded); 0 records none
    trajectory_max_mb   1024, ours: the recorded steps' files at most; past it the oldest
                        steps are removed
    """

    # how a key is named in an error: the `args` name here; a table embedding the knobs
    # names its own keys (slime.deepdive., rollout.)
    KEYS: ClassVar[str] = PREFIX

    max_turns: int = 64
    on_malformed: OnMalformed = "fail"
    tool_timeout_s: float = 300.0
    reward_timeout_s: float = 600.0
    generate_timeout_s: float = 1800.0
    retries: int = 4
    max_aborted_share: float = 0.5
    max_tool_error_share: float = 0.5
    trajectory_groups: int = 4
    trajectory_max_mb: float = 1024.0

    def __post_init__(self) -> None:
        for name in (
            "max_turns",
            "tool_timeout_s",
            "reward_timeout_s",
            "generate_timeout_s",
            "trajectory_max_mb",
        ):
            positive(self.KEYS + name, getattr(self, name))
        if self.on_malformed not in ("fail", "continue"):
            raise ConfigError(
                f"{self.KEYS}on_malformed: expected fail or continue, got {self.on_malformed!r}"
            )
        for name in ("retries", "trajectory_groups"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{self.KEYS}{name}: expected a whole number >= 0, got {value!r}")
        for name in ("max_aborted_share", "max_tool_error_share"):
            share = getattr(self, name)
            if not (
                isinstance(share, int | float) and not isinstance(share, bool) and 0 <= share <= 1
            ):
                raise ConfigError(f"{self.KEYS}{name}: expected a share from 0 to 1, got {share!r}")

    def knobs(self) -> RolloutKnobs:
        """The knobs alone (a table that embeds them carries keys of its own)."""
        return RolloutKnobs(
            **{item.name: getattr(self, item.name) for item in fields(RolloutKnobs)}
        )

    def as_args(self) -> dict[str, Any]:
        """The knobs under their `args` names (keys of the custom-config YAML)."""
        return {arg_name(item.name): getattr(self, item.name) for item in fields(RolloutKnobs)}


@dataclass(frozen=True, kw_only=True)
class RolloutSettings(RolloutKnobs):
    """The knobs (RolloutKnobs), with where the services are and the episode's context:

    sglang_url          SGLang (router) base URL; default http://{sglang_router_ip}:{sglang_router_port}
    tool_server_url     the tool server's base URLs (POST /tool), a list of nodes, each a list
                        of its workers' URLs (one for a server of one process): each episode
                        keeps to one worker of one node, picked from its prompt
                        (deepdive.routing); read from args, `.../tool` works too (for each URL)
    reward_server_url   the reward servers' base URLs (POST /evaluate, /evaluate/batch), a list,
                        one per node in the tool server's order of nodes: a sample's reward
                        comes from its prompt's node; read from args, `.../evaluate` and
                        `.../evaluate/batch` work too
    max_context_tokens  prompt + response never exceed this (slime's --rollout-max-context-len)
    """

    sglang_url: str
    tool_server_url: Nodes
    reward_server_url: tuple[str, ...]
    max_context_tokens: int = 32_768

    def __post_init__(self) -> None:
        super().__post_init__()
        positive(arg_name("max_context_tokens"), self.max_context_tokens)
        check_url(arg_name("sglang_url"), self.sglang_url)
        # checked, and tuples whatever sequences were given (a YAML file's are lists)
        tools = checked_nodes(arg_name("tool_server_url"), self.tool_server_url)
        object.__setattr__(self, "tool_server_url", tools)
        rewards = checked_urls(arg_name("reward_server_url"), self.reward_server_url)
        object.__setattr__(self, "reward_server_url", rewards)

    @classmethod
    def of(
        cls,
        knobs: RolloutKnobs,
        *,
        sglang_url: str,
        tool_server_url: Nodes,
        reward_server_url: tuple[str, ...],
        max_context_tokens: int,
    ) -> RolloutSettings:
        """`knobs` (a table's, embedding them) with the URLs and the context of one rollout."""
        return cls(
            **{item.name: getattr(knobs, item.name) for item in fields(RolloutKnobs)},
            sglang_url=sglang_url,
            tool_server_url=tool_server_url,
            reward_server_url=reward_server_url,
            max_context_tokens=max_context_tokens,
        )

    @property
    def tool_server_nodes(self) -> Nodes:
        """Each node's tool server: its workers' base URLs (one for a server of one process)."""
        return self.tool_server_url

    @property
    def tool_server_urls(self) -> tuple[str, ...]:
        """Every tool server worker's base URL, node after node."""
        return tuple(url for node in self.tool_server_nodes for url in node)

    @property
    def reward_server_urls(self) -> tuple[str, ...]:
        """The reward servers' base URLs: one, or one per node."""
        return self.reward_server_url

    def as_args(self) -> dict[str, Any]:
        """Every setting under its `args` name: the attributes of a Namespace, the URLs as
        lists (what a YAML file holds); `settings_from_args` reads back exactly these."""
        values = {arg_name(item.name): getattr(self, item.name) for item in fields(self)}
        return {**values, **service_urls(self.tool_server_url, self.reward_server_url)}


def slime_custom_config(
    knobs: RolloutKnobs,
    max_context_tokens: int,
    tool_server_url: Nodes,
    reward_server_url: tuple[str, ...],
    trajectory_dir: str | None = None,
) -> dict[str, Any]:
    """The keys of slime's --custom-config-path YAML, which slime sets on `args`: the knobs,
    the episode's context, the services' URLs, checked as the hook reads them, and where
    episodes are recorded. No SGLang URL: inside slime it is its router's
    (`settings_from_args` reads that default)."""
    positive(arg_name("max_context_tokens"), max_context_tokens)
    return {
        **knobs.as_args(),
        arg_name("max_context_tokens"): max_context_tokens,
        **service_urls(tool_server_url, reward_server_url),
        **({TRAJECTORY_DIR_ARG: trajectory_dir} if trajectory_dir else {}),
    }


def trajectory_dir(args: Any) -> Path | None:
    """Where this rollout records its episodes (`TRAJECTORY_DIR_ARG`, or the
    DEEPDIVE_TRAJECTORY_DIR variable by hand); None: nothing is recorded."""
    value = getattr(args, TRAJECTORY_DIR_ARG, None) or os.environ.get("DEEPDIVE_TRAJECTORY_DIR")
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike) or not str(value).strip():
        raise ConfigError(f"{TRAJECTORY_DIR_ARG}: expected a folder's path, got {value!r}")
    return Path(value)


_CONTEXT_DEFAULT = RolloutSettings.__dataclass_fields__["max_context_tokens"].default


def rollout_args(settings: RolloutSettings, tokenizer: Any = None) -> Namespace:
    """What slime's `args` holds for the hooks, for callers without slime (the local backend,
    benchmarks, tests): the settings and, optionally, a tokenizer object."""
    return Namespace(**settings.as_args(), **({TOKENIZER_ARG: tokenizer} if tokenizer else {}))


def _value(args: Any, key: str, default: Any) -> Any:
    value = getattr(args, arg_name(key), None)
    if value is None:
        value = os.environ.get(env_name(key))
    if value is None:
        return default
    kind = type(default) if default is not None else str
    if isinstance(value, str) and kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            raise ConfigError(f"{arg_name(key)}: expected a number, got {value!r}") from None
    return value


def settings_from_args(args: Any) -> RolloutSettings:
    """Validated settings for this `args` (computed once per args object)."""
    cached = getattr(args, "_deepdive_rollout_settings", None)
    if isinstance(cached, RolloutSettings):
        return cached
    router = None
    if getattr(args, "sglang_router_ip", None) and getattr(args, "sglang_router_port", None):
        router = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    context = getattr(args, "rollout_max_context_len", None) or _CONTEXT_DEFAULT
    knobs = {item.name: _value(args, item.name, item.default) for item in fields(RolloutKnobs)}
    settings = RolloutSettings(
        **knobs,
        sglang_url=_value(args, "sglang_url", router),
        tool_server_url=urls_from_args(args, "tool_server_url"),
        reward_server_url=urls_from_args(args, "reward_server_url"),
        max_context_tokens=_value(args, "max_context_tokens", context),
    )
    with contextlib.suppress(AttributeError):  # an args object that refuses attributes
        args._deepdive_rollout_settings = settings
    return settings
