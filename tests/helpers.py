"""What several test modules share: the small corpus, real servers on loopback, and builders of
the rollout's services and arguments. Fixtures stay in conftest.py; fakes live in fakes/."""

from __future__ import annotations

import sys
import time
from argparse import Namespace
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pytest_httpserver import HTTPServer
from starlette.types import ASGIApp

from deepdive.rollout_settings import RolloutSettings, rollout_args
from deepdive.sample import LocalSample
from fakes.sglang import ByteTokenizer
from services.metrics import ServiceMetrics
from services.reward_server.app import create_app as create_reward_app
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.reward_server.rule_judge import RuleJudge
from services.serve import bind, start_server_thread
from services.tool_server.app import create_app as create_tool_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.tools import ToolExecutor

DEEPDIVE = [sys.executable, "-m", "slurm.cli"]

FORBIDDEN_QUESTION = (
    "Which reclusive clockmaker from the valley of Vorn built the silver orrery that was "
    "later stolen from the museum in Haldor during the winter festival?"
)

DOCUMENTS = [
    {
        "url": "https://wiki.example/Orrery_of_Haldor",
        "title": "Orrery of Haldor",
        "text": "The silver orrery of Haldor is a mechanical model of the planets. "
        "It was built by the clockmaker Ilse Varen in the valley of Vorn.",
    },
    {
        "url": "https://wiki.example/Ilse_Varen",
        "title": "Ilse Varen",
        "text": "Ilse Varen was a reclusive clockmaker. She was born in Vorn and built orreries.",
    },
    {
        "url": "https://quiz.example/leak",
        "title": "Quiz answers",
        "text": "Q: " + FORBIDDEN_QUESTION + " A: Ilse Varen.",
    },
    {
        "url": "https://wiki.example/Haldor",
        "title": "Haldor",
        "text": "Haldor is a city with a famous museum. " + "The museum has many rooms. " * 120,
    },
    {
        "url": "https://blocked.example/Vorn",
        "title": "Vorn valley",
        "text": "The valley of Vorn is home to clockmakers.",
    },
]


@contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[str]:
    """Run `app` under a real uvicorn on 127.0.0.1 (a free port); yield its base URL."""
    sock = bind("127.0.0.1", 0)
    stop = start_server_thread(app, sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop()


def wait_for_requests(server: HTTPServer, count: int, timeout_s: float = 5.0) -> None:
    """Block until a fake upstream has logged `count` requests: a slow handler that outlives
    its test would otherwise land in the next test's log."""
    deadline = time.monotonic() + timeout_s
    while len(server.log) < count and time.monotonic() < deadline:
        time.sleep(0.02)


PROMPT = f"<|im_start|>user\n{FORBIDDEN_QUESTION}<|im_end|>\n<|im_start|>assistant\n"
TOKENIZER = ByteTokenizer()


def tool_app(corpus_file: Path, tmp_path: Path) -> Any:
    config = ToolServerConfig(corpus=corpus_file, index_cache_dir=tmp_path / "idx", page_chars=400)
    metrics = ServiceMetrics("tool")
    search, reader = build_providers(config, metrics)
    return create_tool_app(ToolExecutor(config, search, reader, metrics), metrics)


def reward_app() -> Any:
    return create_reward_app(
        RewardServerConfig(), Evaluator(RuleJudge(), 10), ServiceMetrics("reward")
    )


def make_args(sglang: str, services: dict[str, str], **extra: Any) -> Namespace:
    settings = RolloutSettings(
        sglang_url=sglang,
        tool_server_url=services["tools"],
        reward_server_url=services["reward"],
        retries=0,
        max_context_tokens=extra.pop("context", 100_000),
        **extra,
    )
    return rollout_args(settings, TOKENIZER)


def new_sample() -> LocalSample:
    return LocalSample(
        prompt=PROMPT,
        label="Ilse Varen",
        metadata={
            "remote_env_info": {"forbidden_texts": [FORBIDDEN_QUESTION]},
            "aliases": ["I. Varen"],
        },
    )
