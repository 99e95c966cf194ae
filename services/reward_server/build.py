"""Turn a RewardServerConfig into a working judge: read the key, open the client."""

from __future__ import annotations

import logging

from services.base.logs import log_event
from services.base.secrets import read_secret
from services.reward_server.config import RewardServerConfig
from services.reward_server.judging import Judge
from services.reward_server.openai_judge import KEY_ENVS, OpenAIJudge
from services.reward_server.rule_judge import RuleJudge
from services.serving.metrics import ServiceMetrics

logger = logging.getLogger("deepdive.reward_server")


def build_judge(
    config: RewardServerConfig,
    metrics: ServiceMetrics | None = None,
) -> Judge:
    judge: Judge
    if config.judge == "openai":
        key = next((k for k in (read_secret(name) for name in KEY_ENVS) if k), None)
        judge = OpenAIJudge(
            config.judge_upstream, key, config.judge_model, config.judge_cache, metrics
        )
    else:
        judge = RuleJudge()
    reason = judge.not_ready_reason()
    if reason:
        log_event(logger, "judge_not_ready", logging.WARNING, judge=judge.name, reason=reason)
    return judge
