"""`deepdive serve reward`: the command-line face of the reward server."""

from __future__ import annotations

import argparse

from services.base.config_options import add_config_options, config_from_options
from services.reward_server.app import create_app
from services.reward_server.build import build_judge
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.serving.metrics import ServiceMetrics
from services.serving.serve import (
    add_server_arguments,
    announcer,
    bind,
    prepare,
    serve,
)

DEFAULT_PORT = 8701


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser, DEFAULT_PORT)
    add_config_options(parser, RewardServerConfig())
    parser.epilog = (
        "The judge's key comes from the environment only: DEEPDIVE_JUDGE_API_KEY or OPENAI_API_KEY "
        "(or --env-file). slime: --rm-type remote_rm --rm-url http://HOST:PORT/evaluate --reward-key reward"
    )


def config_from_args(args: argparse.Namespace) -> RewardServerConfig:
    """--config's file and the config options on top of the defaults."""
    return config_from_options(args, RewardServerConfig())


def run(args: argparse.Namespace) -> None:
    config = config_from_args(args)  # a bad key fails before anything binds
    token = prepare(args)
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
        args.ready_file,
    )
    limits = config.connections
    serve(
        app,
        sock,
        log_level=args.log_level,
        on_listening=announce,
        limits=limits,
        metrics=metrics,
    )
