"""Secrets come from the environment or from an env file only readable by its owner.

Never from a config file, a command-line flag or a request: those end up in job folders, in
`ps` output and in logs. Every secret read here is registered for log redaction.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

from services.base.errors import ConfigError
from services.base.logs import register_secret

# The shared bearer token of our services (clients send it, servers require it when set).
TOKEN_ENV = "DEEPDIVE_SERVICE_TOKEN"  # noqa: S105 (a variable name, not a secret)
# Where a node is told its proxy (urllib and aiohttp read either spelling); never a config field.
PROXY_ENVS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def check_env_file(path: str | Path) -> None:
    """The file exists and neither group nor others can read it (mode 0600 or stricter)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ConfigError(f"env file {path}: no such file") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"env file {path}: mode {stat.S_IMODE(mode):04o} lets other users read it; "
            f"run `chmod 600 {path}`"
        )


def load_env_file(path: str | Path) -> dict[str, str]:
    """Parse KEY=VALUE lines of a private env file (see check_env_file)."""
    path = Path(path)
    check_env_file(path)
    values: dict[str, str] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError(f"env file {path}, line {lineno}: expected KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def load_secrets(path: str | Path | None) -> dict[str, str]:
    """The env file's values (none for no file), each registered for redaction with this
    process's service token: what a node, the smoke kit and `deepdive eval` hand their
    services through the environment, and nothing else."""
    values = load_env_file(path) if path else {}
    for value in values.values():
        register_secret(value)
    register_secret(os.environ.get(TOKEN_ENV))
    return values


def env_file_keys(path: str | Path) -> set[str]:
    """The names an env file sets (the file checked and parsed as load_env_file does; every
    value dropped at once): what a submitting machine may know of a file read on the nodes."""
    return set(load_env_file(path))


def apply_env_file(path: str | Path) -> None:
    """Load an env file into os.environ without overriding variables already set."""
    for key, value in load_env_file(path).items():
        os.environ.setdefault(key, value)


def read_secret(name: str) -> str | None:
    """The value of environment variable `name` (None when unset or empty), registered for redaction."""
    value = os.environ.get(name, "").strip() or None
    register_secret(value)
    return value


def register_proxy_secrets() -> None:
    """Register the password of every proxy URL in the environment (`http://user:pw@host:3128`)
    for redaction: the URL may be quoted by an error or a log line."""
    for name in PROXY_ENVS:
        value = os.environ.get(name, "").strip()
        if not value:
            continue
        try:
            password = urlsplit(value).password
        except ValueError:  # not a URL (a bad port): aiohttp refuses it; keep it out whole
            register_secret(value)
            continue
        register_secret(password)
        register_secret(unquote(password) if password else None)
