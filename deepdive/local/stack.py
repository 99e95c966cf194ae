"""The services a local run talks to, as on a cluster node: the tool server and the reward server
as child processes (`python -m services`), the local engine in this process."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from services.base.config_options import config_text
from services.base.files import atomic_write_bytes
from services.base.process import ServiceProcess
from services.serving.serve import bind, start_server_thread


def offline_tools_config(world: Path) -> dict[str, Any]:
    """The tool server's config (a table of ToolServerConfig) over one world's pages: the
    offline search and reader (the defaults), the index built at start (the world is small)."""
    return {"corpus": str(world / "corpus.jsonl"), "index_cache": False}


def tool_server(world: Path, log: Path) -> ServiceProcess:
    """The tool server over one world's pages, as one process: on one machine the trainer and
    the engine need the cores, and a small world's searches cost little. Its config file
    goes beside its log."""
    config = log.with_suffix(".toml")
    atomic_write_bytes(config, config_text(offline_tools_config(world)).encode())
    arguments = ["tools", "--config", str(config), "--workers", "1", "--log-level", "WARNING"]
    return ServiceProcess("tool", arguments, log)


def reward_server(log: Path) -> ServiceProcess:
    """The reward server with the rule judge (its default: no key, no network)."""
    return ServiceProcess("reward", ["reward", "--log-level", "WARNING"], log)


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
