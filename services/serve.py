"""Run an ASGI app under uvicorn: bind first (so port 0 works and the real port is known),
refuse to expose an unauthenticated service beyond loopback, log like the rest of the project."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable

import uvicorn
from starlette.types import ASGIApp

from services.exceptions import ConfigError
from services.web import TOKEN_ENV


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
