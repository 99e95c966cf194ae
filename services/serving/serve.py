"""Run an ASGI app under uvicorn: bind first (so port 0 works and the real port is known),
refuse to expose an unauthenticated service beyond loopback, cut off slow clients and cap open
connections, in all and per client (services/serving/connections.py), log like the rest of the
project. Every pending connection is accepted on each readiness of the socket
(services/serving/accepting.py; docs/services.md: why not uvicorn's own listener)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import uvicorn
from starlette.types import ASGIApp

from services.base.config_options import add_field_options, config_from_options
from services.base.errors import ConfigError
from services.base.logs import configure_logging
from services.base.ready import ReadyRecord, write_ready
from services.base.secrets import TOKEN_ENV, apply_env_file, read_secret
from services.serving.connections import ConnectionGuard, ConnectionLimits, ensure_fd_limit
from services.serving.heap import settle_heap
from services.serving.metrics import ServiceMetrics
from services.serving.uvicorn_internals import ServiceServer, protocol_class

# Connections the kernel completes before the server accepts them (uvicorn's default): what
# queues while a worker is being replaced, since its supervisor keeps the socket listening.
BACKLOG = 2048


def add_server_arguments(parser: argparse.ArgumentParser, default_port: int) -> None:
    """The options every `deepdive serve SERVICE` takes."""
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=default_port, help="0 picks a free port (default: %(default)s)"
    )
    parser.add_argument(
        "--env-file", type=Path, help="read API keys from this KEY=VALUE file (mode 0600)"
    )
    parser.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help=f"serve beyond loopback without {TOKEN_ENV}",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="once listening, write the URL, pid, host and port here as JSON, whole "
        "(what a starting process waits for: services.base.ready)",
    )


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """`--header-timeout`, `--max-connections`, ...: ConnectionLimits' fields as options, for
    a server without a config file of its own (the local engine)."""
    add_field_options(parser, ConnectionLimits())


def connection_limits(args: argparse.Namespace) -> ConnectionLimits:
    """The limits `add_connection_options`' options give (ConfigError names a bad one)."""
    return config_from_options(args, ConnectionLimits())


def prepare(args: argparse.Namespace) -> str | None:
    """Logging, env file, the service token, the exposure check; returns the token."""
    configure_logging(args.log_level)
    if args.env_file:
        apply_env_file(args.env_file)
    token = read_secret(TOKEN_ENV)
    check_exposure(args.host, token, args.allow_unauthenticated)
    return token


class Announce(Protocol):
    def __call__(self, host: str, *ports: int) -> None: ...


def announcer(
    title: str, token: str | None, examples: Sequence[str], ready_file: Path | None = None
) -> Announce:
    """Prints where the service listens and how to try it, for people; `{base}` and `{auth}`
    are filled in. A starting process reads `ready_file` (services.base.ready), written after.

    With several ports (one per worker process, services.serving.workers) "listening on" is followed
    by every worker's URL, separated by commas: the value the rollout's `deepdive_tool_server_url`
    takes, and the ready record's url."""

    def announce(host: str, *ports: int) -> None:
        bases = [f"http://{url_host(host)}:{port}" for port in ports]
        base = bases[0]
        auth = f" -H 'Authorization: Bearer ${TOKEN_ENV}'" if token else ""
        lines = [f"{title} listening on {','.join(bases)}"]
        if len(bases) > 1:
            lines.append(
                f"  {len(bases)} workers, a process each, sharing nothing: a session's calls "
                "must all go to one (the rollout picks it from the prompt)"
            )
        lines += ["  " + example.format(base=base, auth=auth) for example in examples]
        each = " (each worker has its own)" if len(bases) > 1 else ""
        lines.append(f"  health: {base}/health  ready: {base}/ready  metrics: {base}/metrics{each}")
        print("\n".join(lines), file=sys.stderr, flush=True)
        if ready_file is not None:
            record = ReadyRecord(tuple(bases), pid=os.getpid(), host=host, port=ports[0])
            write_ready(ready_file, record)

    return announce


def url_host(host: str) -> str:
    """`host` as a URL spells it: an IPv6 address goes in brackets (`http://[::1]:8700`), its
    zone's "%" escaped as RFC 6874 asks; names and IPv4 addresses stay as they are."""
    if ":" not in host or host.startswith("["):
        return host
    return "[" + host.replace("%", "%25") + "]"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, token: str | None, allow_unauthenticated: bool) -> None:
    if not is_loopback(host) and token is None and not allow_unauthenticated:
        raise ConfigError(
            f"--host {host} exposes the service beyond this machine without authentication: "
            f"set {TOKEN_ENV} (clients send it as a bearer token), or pass "
            "--allow-unauthenticated if the network is trusted"
        )


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def server_config(app: ASGIApp, guard: ConnectionGuard, log_level: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        log_config=None,  # our logging configuration stays in charge
        log_level=log_level.lower(),
        access_log=False,  # one line per call comes from the app, without request bodies
        proxy_headers=False,  # no proxy in front: X-Forwarded-For is not read on every request
        loop="auto",
        http=protocol_class(guard),  # httptools, with header/body timeouts and the caps
        lifespan="on",
        backlog=BACKLOG,
        timeout_graceful_shutdown=10,
    )


def serve(
    app: ASGIApp,
    sock: socket.socket,
    log_level: str = "info",
    on_listening: Callable[[str, int], None] | None = None,
    limits: ConnectionLimits | None = None,
    metrics: ServiceMetrics | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. `on_listening(host, port)` is called once the socket is bound.
    `limits` (default: ConnectionLimits()) bounds slow clients and open connections; `metrics`,
    the app's, gets the refused and cut-off connections' counts."""
    guard = ConnectionGuard(limits or ConnectionLimits())
    if metrics is not None:
        metrics.watch_connections(guard)
    host, port = sock.getsockname()[:2]
    ensure_fd_limit(guard.limits.max_connections)
    config = server_config(app, guard, log_level)
    if on_listening is not None:
        on_listening(host, port)
    settle_heap()  # this process is the service from here on (services/serving/heap.py: why)
    ServiceServer(config, guard).run(sockets=[sock])


def start_server_thread(
    app: ASGIApp,
    sock: socket.socket,
    limits: ConnectionLimits | None = None,
    metrics: ServiceMetrics | None = None,
) -> Callable[[], None]:
    """Serve `app` under uvicorn on a bound socket in a daemon thread (its own event loop), for
    in-process servers (the local engine, tests); returns the function that stops it once the
    socket listens. The same connection limits as `serve()` apply (default: ConnectionLimits())."""
    guard = ConnectionGuard(limits or ConnectionLimits())
    if metrics is not None:
        metrics.watch_connections(guard)
    server = ServiceServer(server_config(app, guard, "warning"), guard)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    # uvicorn sets `started` once its sockets listen: a connect from here on is not refused
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()

    return stop
