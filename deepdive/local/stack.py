"""The services a local run talks to, as on a cluster node: the tool server and the reward server
as child processes (`python -m services`), the local engine in this process."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services.base.process import ServiceProcess
from services.serving.serve import bind, start_server_thread


def offline_tools_arguments(world: Path) -> list[str]:
    """`python -m services` arguments of the tool server over one world's pages (offline
    search and reader; the index is built at start, the world is small)."""
    return ["tools", "--search", "offline", "--reader", "offline", "--no-index-cache",
            "--corpus", str(world / "corpus.jsonl")]  # fmt: skip


def tool_server(world: Path, log: Path) -> ServiceProcess:
    """The tool server over one world's pages, as one process: on one machine the trainer and
    the engine need the cores, and a small world's searches cost little."""
    arguments = [*offline_tools_arguments(world), "--workers", "1", "--log-level", "WARNING"]
    return ServiceProcess("tool", arguments, log)


def reward_server(log: Path) -> ServiceProcess:
    """The reward server with the rule judge (no key, no network)."""
    return ServiceProcess("reward", ["reward", "--judge", "rule", "--log-level", "WARNING"], log)


@contextmanager
def engine_server(model: Any, tokenizer: Any, max_batch: int) -> Iterator[tuple[str, Any]]:
    """The local engine on a loopback port, in this process (weights are synced in memory)."""
    from deepdive.local.engine import LocalEngine, create_engine_app

    engine = LocalEngine(copy.deepcopy(model), tokenizer, max_batch=max_batch)
    sock = bind("127.0.0.1", 0)
    stop = start_server_thread(create_engine_app(engine), sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine
    finally:
        stop()
