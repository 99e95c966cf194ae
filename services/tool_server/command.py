"""`deepdive serve tools`: the command-line face of the tool server."""

from __future__ import annotations

import argparse
import functools
import socket
import sys
from collections.abc import Callable

from starlette.types import ASGIApp

from services.base.config_options import add_config_options, config_from_options
from services.base.secrets import TOKEN_ENV
from services.serving.metrics import ServiceMetrics
from services.serving.serve import add_server_arguments, announcer, prepare, serve
from services.serving.workers import (
    MAX_DEFAULT_WORKERS,
    WorkerSlot,
    bind_workers,
    check_workers,
    default_workers,
    supervise,
)
from services.tool_server.app import create_app
from services.tool_server.build import build_providers, load_index
from services.tool_server.config import ToolServerConfig
from services.tool_server.providers import PageReader, SearchProvider
from services.tool_server.tools import ToolExecutor

DEFAULT_PORT = 8700
ProviderBuilder = Callable[
    [ToolServerConfig, ServiceMetrics, bool], tuple[SearchProvider, PageReader]
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser, DEFAULT_PORT)
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="worker processes, each its own event loop on its own port (--port P: P to P+N-1; "
        "--port 0: a free port each) and its own caches; a session's calls must all reach one "
        f"(default: one per core this process may run on, at most {MAX_DEFAULT_WORKERS}; "
        f"here {default_workers()})",
    )
    add_config_options(parser, ToolServerConfig())
    parser.epilog = (
        "API keys come from the environment only: SERPER_API_KEY, SERPAPI_API_KEY, JINA_API_KEY "
        f"(or --env-file). {TOKEN_ENV}, when set, is required as a bearer token by every endpoint "
        "but /health."
    )


def config_from_args(args: argparse.Namespace) -> ToolServerConfig:
    """--config's file and the config options on top of the defaults."""
    return config_from_options(args, ToolServerConfig())


EXAMPLES = [
    "try: curl -s{auth} -X POST {base}/tool -H 'Content-Type: application/json' "
    '-d \'{{"session_id": "demo", "name": "search", "arguments": {{"query": "Ada Lovelace"}}}}\'',
    'then: ... -d \'{{"session_id": "demo", "name": "click", "arguments": {{"link_id": 1}}}}\'',
]


def run(args: argparse.Namespace) -> None:
    """One process for --workers 1; more: a supervisor and a worker process per port."""
    config = config_from_args(args)  # a bad key fails before anything binds
    token = prepare(args)
    policy = config.supervision
    workers = default_workers() if args.workers is None else check_workers(args.workers)
    sockets = bind_workers(args.host, args.port, workers)
    title = f"tool server (search={config.search}, reader={config.reader})"
    announce = announcer(title, token, EXAMPLES, args.ready_file)
    limits = config.connections
    show_progress = sys.stderr.isatty()
    if workers == 1:
        metrics = ServiceMetrics("tool")
        app = tool_app(config, token, build_providers, show_progress, metrics)
        serve(
            app,
            sockets[0],
            log_level=args.log_level,
            on_listening=announce,
            limits=limits,
            metrics=metrics,
        )
        return
    index = load_index(config, show_progress)  # once, shared by the workers' forks

    def serve_worker(slot: WorkerSlot, sock: socket.socket) -> None:
        metrics = ServiceMetrics("tool")
        metrics.worker_restarts.inc(slot.restarts)
        build = functools.partial(build_providers, index=index)
        app = tool_app(config, token, build, False, metrics, replacement=slot.restarts > 0)
        serve(
            app,
            sock,
            log_level=args.log_level,
            on_listening=lambda host, port: slot.serving(),
            limits=limits,
            metrics=metrics,
        )

    host = sockets[0].getsockname()[0]
    announce(host, *(sock.getsockname()[1] for sock in sockets))
    supervise(sockets, serve_worker, "tool server", policy)


def tool_app(
    config: ToolServerConfig,
    token: str | None,
    build: ProviderBuilder,
    show_progress: bool,
    metrics: ServiceMetrics,
    replacement: bool = False,
) -> ASGIApp:
    """The tool server's app with its own providers, caches and sessions, counting into
    `metrics`; `replacement`: its worker replaces one that died (its sessions are lost)."""
    search, reader = build(config, metrics, show_progress)
    executor = ToolExecutor(config, search, reader, metrics, replacement=replacement)
    return create_app(executor, metrics, token=token)
