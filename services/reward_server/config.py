"""The reward server's configuration: one typed, validated dataclass with documented defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from services.base.errors import ConfigError
from services.base.typed_config import positive
from services.cache import CacheSettings
from services.client.http import UpstreamSettings
from services.reward_server import openai_judge
from services.serving.connections import ConnectionLimits

JudgeBackend = Literal["rule", "openai"]
JUDGE_BACKENDS: tuple[str, ...] = get_args(JudgeBackend)


@dataclass(frozen=True)
class RewardServerConfig:
    """judge             rule (embedded default, no key) or openai (any compatible endpoint)
    judge_upstream    where the judge lives, its concurrency bound, timeouts and retries
    judge_model       the model name sent to the endpoint
    judge_cache       verdict cache (entries, TTL; failures live 1 s)
    deadline_s        total time for one judgement, retries included
    max_body_bytes    larger request bodies are refused with 413
    max_batch         the most items one POST /evaluate/batch may carry
    connections       slow clients and open connections (services.serving.connections)

    `python -m services reward --config FILE` reads it from a TOML file whose keys are these
    fields (services.base.config_options).
    """

    judge: JudgeBackend = "rule"
    judge_upstream: UpstreamSettings = field(
        default_factory=lambda: UpstreamSettings(
            openai_judge.DEFAULT_URL,
            max_concurrency=openai_judge.DEFAULT_CONCURRENCY,
            read_timeout_s=60.0,
        )
    )
    judge_model: str = openai_judge.DEFAULT_MODEL
    judge_cache: CacheSettings = field(
        default_factory=lambda: CacheSettings(
            max_entries=100_000, ttl_s=86_400.0, failure_ttl_s=1.0
        )
    )
    deadline_s: float = 120.0
    max_body_bytes: int = 16_000_000
    max_batch: int = 1024
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    def __post_init__(self) -> None:
        if self.judge not in JUDGE_BACKENDS:
            raise ConfigError(
                f"judge: expected one of {', '.join(JUDGE_BACKENDS)}, got {self.judge!r}"
            )
        for name in ("deadline_s", "max_body_bytes", "max_batch"):
            positive(name, getattr(self, name))
        positive("judge_upstream.max_concurrency", self.judge_upstream.max_concurrency)
        if not self.judge_model.strip():
            raise ConfigError("judge_model: expected a model name")
