"""`deepdive serve reward`: the command-line face of the reward server."""

from __future__ import annotations

import argparse
from dataclasses import replace

from services.metrics import ServiceMetrics
from services.reward_server.app import create_app
from services.reward_server.build import build_judge
from services.reward_server.config import JUDGE_BACKENDS, RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.serving.serve import (
    add_server_arguments,
    announcer,
    bind,
    connection_limits,
    prepare,
    serve,
)

DEFAULT_PORT = 8701


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = RewardServerConfig()
    add_server_arguments(parser, DEFAULT_PORT)
    parser.add_argument(
        "--judge",
        choices=JUDGE_BACKENDS,
        default=defaults.judge,
        help="rule: normalised exact match, no key; openai: an OpenAI-compatible LLM judge "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--judge-url",
        default=defaults.judge_upstream.base_url,
        help="base URL of the OpenAI-compatible API (default: %(default)s)",
    )
    parser.add_argument(
        "--judge-model",
        default=defaults.judge_model,
        help="judge model name (default: %(default)s)",
    )
    parser.add_argument(
        "--judge-concurrency",
        type=int,
        default=defaults.judge_upstream.max_concurrency,
        help="concurrent judge requests at most (default: %(default)s)",
    )
    parser.add_argument(
        "--judge-retries",
        type=int,
        default=defaults.judge_upstream.retry.max_attempts - 1,
        help="retries on 429/5xx/timeouts (default: %(default)s)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=defaults.deadline_s,
        help="total seconds per judgement, retries included (default: %(default)s)",
    )
    parser.epilog = (
        "The judge's key comes from the environment only: DEEPDIVE_JUDGE_API_KEY or OPENAI_API_KEY "
        "(or --env-file). slime: --rm-type remote_rm --rm-url http://HOST:PORT/evaluate --reward-key reward"
    )


def config_from_args(args: argparse.Namespace) -> RewardServerConfig:
    base = RewardServerConfig()
    upstream = base.judge_upstream
    retry = replace(upstream.retry, max_attempts=max(1, args.judge_retries + 1))
    return replace(
        base,
        judge=args.judge,
        judge_upstream=replace(
            upstream, base_url=args.judge_url, max_concurrency=args.judge_concurrency, retry=retry
        ),
        judge_model=args.judge_model,
        deadline_s=args.deadline,
    )


def check_arguments(args: argparse.Namespace) -> None:
    """What `run` builds from the options before it binds: the config (a ConfigError names
    what is wrong)."""
    config_from_args(args)


def run(args: argparse.Namespace) -> None:
    token = prepare(args)
    config = config_from_args(args)
    sock = bind(args.host, args.port)
    metrics = ServiceMetrics("reward")
    evaluator = Evaluator(build_judge(config, metrics), config.deadline_s)
    app = create_app(config, evaluator, metrics, token=token)
    announce = announcer(
        f"reward server (judge={config.judge})",
        token,
        [
            "try: curl -s{auth} -X POST {base}/evaluate -H 'Content-Type: application/json' "
            '-d \'{{"response": "<tool_call>{{\\"name\\": \\"finish\\", \\"arguments\\": {{\\"answer\\": \\"Paris\\"}}}}</tool_call>", "label": "Paris"}}\'',
        ],
    )
    limits = connection_limits(args)
    serve(
        app,
        sock,
        log_level=args.log_level,
        on_listening=announce,
        limits=limits,
        metrics=metrics,
    )
