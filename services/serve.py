"""Run an ASGI app under uvicorn: bind first (so port 0 works and the real port is known),
refuse to expose an unauthenticated service beyond loopback, log like the rest of the project."""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from services.exceptions import ConfigError
from services.logs import configure_logging
from services.secrets import apply_env_file, read_secret
from services.web import TOKEN_ENV


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


def prepare(args: argparse.Namespace) -> str | None:
    """Logging, env file, the service token and the exposure check; returns the token."""
    configure_logging(args.log_level)
    if args.env_file:
        apply_env_file(args.env_file)
    token = read_secret(TOKEN_ENV)
    check_exposure(args.host, token, args.allow_unauthenticated)
    return token


def announcer(title: str, token: str | None, examples: Sequence[str]) -> Callable[[str, int], None]:
    """Prints where the service listens and how to try it; `{base}` and `{auth}` are filled in."""

    def announce(host: str, port: int) -> None:
        base = f"http://{host}:{port}"
        auth = f" -H 'Authorization: Bearer ${TOKEN_ENV}'" if token else ""
        lines = [f"{title} listening on {base}"]
        lines += ["  " + example.format(base=base, auth=auth) for example in examples]
        lines.append(f"  health: {base}/health  ready: {base}/ready  metrics: {base}/metrics")
        print("\n".join(lines), file=sys.stderr, flush=True)

    return announce


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


def serve(
    app: ASGIApp,
    sock: socket.socket,
    log_level: str = "info",
    on_listening: Callable[[str, int], None] | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. `on_listening(host, port)` is called once the socket is bound."""
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        log_config=None,  # our logging configuration stays in charge
        log_level=log_level.lower(),
        access_log=False,  # one line per call comes from the app, without request bodies
        loop="auto",
        http="auto",
        lifespan="on",
        timeout_graceful_shutdown=10,
    )
    if on_listening is not None:
        on_listening(host, port)
    uvicorn.Server(config).run(sockets=[sock])


def start_server_thread(app: ASGIApp, sock: socket.socket) -> Callable[[], None]:
    """Serve `app` under uvicorn on a bound socket in a daemon thread (its own event loop), for
    in-process servers (the local engine, tests); returns the function that stops it."""
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", log_level="warning")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()

    return stop
