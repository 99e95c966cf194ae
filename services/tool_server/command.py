"""`deepdive serve tools`: the command-line face of the tool server."""

from __future__ import annotations

import argparse
import functools
import socket
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from starlette.types import ASGIApp

from services.base.secrets import TOKEN_ENV
from services.http import UpstreamSettings
from services.metrics import ServiceMetrics
from services.serving.serve import (
    add_server_arguments,
    announcer,
    connection_limits,
    prepare,
    serve,
)
from services.serving.supervision import SupervisionPolicy
from services.serving.workers import (
    MAX_DEFAULT_WORKERS,
    WorkerSlot,
    bind_workers,
    check_workers,
    default_workers,
    supervise,
)
from services.tool_server import jina, serpapi, serper
from services.tool_server.app import create_app
from services.tool_server.build import build_providers, load_index
from services.tool_server.config import READER_BACKENDS, SEARCH_BACKENDS, ToolServerConfig
from services.tool_server.providers import PageReader, SearchProvider
from services.tool_server.tools import ToolExecutor

DEFAULT_PORT = 8700
ProviderBuilder = Callable[
    [ToolServerConfig, ServiceMetrics, bool], tuple[SearchProvider, PageReader]
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = ToolServerConfig(index_cache_dir=None)
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
    supervision = SupervisionPolicy()
    parser.add_argument(
        "--worker-restarts-per-minute",
        type=int,
        default=supervision.max_restarts,
        metavar="N",
        help="a worker that dies or stops answering /health is started again on its port; "
        "past N restarts in a minute (all workers together) the server fails "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--worker-ping-interval",
        type=float,
        default=supervision.ping_interval_s,
        metavar="SECONDS",
        help="the supervisor asks each worker's /health this often (default: %(default)s)",
    )
    parser.add_argument(
        "--worker-ping-timeout",
        type=float,
        default=supervision.ping_timeout_s,
        metavar="SECONDS",
        help="a ping unanswered this long is missed (default: %(default)s)",
    )
    parser.add_argument(
        "--worker-missed-pings",
        type=int,
        default=supervision.missed_pings,
        metavar="N",
        help="a worker that misses N pings in a row is frozen: killed and started again "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--search",
        choices=SEARCH_BACKENDS,
        default=defaults.search,
        help="search provider (default: %(default)s)",
    )
    parser.add_argument(
        "--reader",
        choices=READER_BACKENDS,
        default=defaults.reader,
        help="page reader for open/click (default: %(default)s)",
    )
    parser.add_argument(
        "--corpus",
        type=Path,
        help="JSONL corpus {url, title, text} for the offline providers (default: the bundled Wikipedia extracts)",
    )
    parser.add_argument(
        "--index-cache",
        type=Path,
        help="where BM25 indexes are cached (default: ~/.cache/deepdive/bm25)",
    )
    parser.add_argument(
        "--no-index-cache", action="store_true", help="build the index in memory every start"
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=defaults.call_deadline_s,
        help="total seconds per tool call, retries included (default: %(default)s)",
    )
    parser.add_argument(
        "--page-chars",
        type=int,
        default=defaults.page_chars,
        help="characters per page of open/click output (default: %(default)s)",
    )
    parser.add_argument(
        "--max-query-chars",
        type=int,
        default=defaults.max_query_chars,
        help="longer search queries are refused with a tool error (default: %(default)s)",
    )
    parser.add_argument(
        "--max-page-chars",
        type=int,
        default=defaults.max_page_chars,
        help="a page's text is cut at this many characters (default: %(default)s)",
    )
    parser.add_argument(
        "--search-cache-mb",
        type=int,
        default=defaults.search_cache.max_bytes // 2**20,
        help="memory for cached search results, MiB (default: %(default)s)",
    )
    parser.add_argument(
        "--page-cache-mb",
        type=int,
        default=defaults.page_cache.max_bytes // 2**20,
        help="memory for cached pages, MiB (default: %(default)s)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="requests in flight per upstream, for every upstream (default: each provider's "
        f"own, from its rate limits: serper {defaults.serper.max_concurrency}, serpapi "
        f"{defaults.serpapi.max_concurrency}, jina {defaults.jina.max_concurrency}, direct "
        f"{defaults.direct.max_concurrency})",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=defaults.serper.retry.max_attempts - 1,
        help="retries on 429/5xx/transport errors (default: %(default)s)",
    )
    parser.add_argument(
        "--cache-ttl",
        type=float,
        default=defaults.search_cache.ttl_s,
        help="seconds a search result or page stays cached (default: %(default)s)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="send every call upstream (no caching, no collapsing of identical calls)",
    )
    parser.add_argument(
        "--block-domain",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="never show or open this domain (repeatable)",
    )
    parser.add_argument(
        "--allow-network",
        action="append",
        default=[],
        metavar="CIDR",
        help="let the direct reader fetch from this private network (repeatable)",
    )
    parser.add_argument("--gl", help="search country code passed to the search API")
    parser.add_argument("--hl", help="search language code passed to the search API")
    parser.add_argument(
        "--serper-url",
        default=serper.DEFAULT_URL,
        help=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--serpapi-url",
        default=serpapi.DEFAULT_URL,
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--jina-url", default=jina.DEFAULT_URL, help=argparse.SUPPRESS)
    parser.epilog = (
        "API keys come from the environment only: SERPER_API_KEY, SERPAPI_API_KEY, JINA_API_KEY "
        f"(or --env-file). {TOKEN_ENV}, when set, is required as a bearer token by every endpoint "
        "but /health."
    )


def config_from_args(args: argparse.Namespace) -> ToolServerConfig:
    base = ToolServerConfig()

    def upstream(settings: UpstreamSettings, url: str) -> UpstreamSettings:
        retry = replace(settings.retry, max_attempts=max(1, args.retries + 1))
        bound = args.max_concurrency or settings.max_concurrency
        return replace(settings, base_url=url, max_concurrency=bound, retry=retry)

    return replace(
        base,
        search=args.search,
        reader=args.reader,
        corpus=args.corpus,
        index_cache_dir=None if args.no_index_cache else (args.index_cache or base.index_cache_dir),
        serper=upstream(base.serper, args.serper_url),
        serpapi=upstream(base.serpapi, args.serpapi_url),
        jina=upstream(base.jina, args.jina_url),
        direct=upstream(base.direct, ""),
        gl=args.gl,
        hl=args.hl,
        call_deadline_s=args.deadline,
        page_chars=args.page_chars,
        max_query_chars=args.max_query_chars,
        max_page_chars=args.max_page_chars,
        search_cache=replace(
            base.search_cache,
            ttl_s=args.cache_ttl,
            enabled=not args.no_cache,
            max_bytes=args.search_cache_mb * 2**20,
        ),
        page_cache=replace(
            base.page_cache,
            ttl_s=args.cache_ttl,
            enabled=not args.no_cache,
            max_bytes=args.page_cache_mb * 2**20,
        ),
        blocked_domains=tuple(args.block_domain),
        allowed_networks=tuple(args.allow_network),
    )


def check_arguments(args: argparse.Namespace) -> None:
    """What `run` builds from the options before it binds: the config and the workers'
    supervision (a ConfigError names what is wrong)."""
    config_from_args(args)
    supervision_policy(args)
    if args.workers is not None:
        check_workers(args.workers)


EXAMPLES = [
    "try: curl -s{auth} -X POST {base}/tool -H 'Content-Type: application/json' "
    '-d \'{{"session_id": "demo", "name": "search", "arguments": {{"query": "Ada Lovelace"}}}}\'',
    'then: ... -d \'{{"session_id": "demo", "name": "click", "arguments": {{"link_id": 1}}}}\'',
]


def run(args: argparse.Namespace) -> None:
    """One process for --workers 1; more: a supervisor and a worker process per port."""
    token = prepare(args)
    config = config_from_args(args)
    policy = supervision_policy(args)  # a bad option fails before anything binds
    workers = default_workers() if args.workers is None else check_workers(args.workers)
    sockets = bind_workers(args.host, args.port, workers)
    title = f"tool server (search={config.search}, reader={config.reader})"
    announce = announcer(title, token, EXAMPLES)
    limits = connection_limits(args)
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


def supervision_policy(args: argparse.Namespace) -> SupervisionPolicy:
    """The workers' supervision from the command line (ConfigError names a bad option)."""
    return SupervisionPolicy(
        max_restarts=args.worker_restarts_per_minute,
        ping_interval_s=args.worker_ping_interval,
        ping_timeout_s=args.worker_ping_timeout,
        missed_pings=args.worker_missed_pings,
    )


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
