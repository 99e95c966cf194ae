"""Where the services are: the tool server's and the reward servers' base URLs, as the rollout's
settings carry them, checked, and read back. The tool server's is a list of nodes, each a list
of its workers' URLs; the reward servers' one per node, in that order. A job of several nodes
gives every node's: each episode keeps to one worker of one node, picked from its prompt
(deepdive.routing). Only the environment fallback spells them as one string
(`nodes_from_text`, `urls_from_text`). DeepDive's own variables name the endpoints (`.../tool`,
`.../evaluate`), so those exact trailing segments are taken off when read here
(`endpoint_base`), and either spelling works.

Apart from the knobs (deepdive.rollout_settings), which hold these URLs and read them from
slime's `args` through `urls_from_args`.
"""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from deepdive.arg_names import arg_name, env_name
from services.base.errors import ConfigError
from services.base.logs import log_event

__all__ = [
    "ENDPOINTS",
    "NODES",
    "WORKERS",
    "Nodes",
    "check_url",
    "checked_nodes",
    "checked_urls",
    "endpoint_base",
    "nodes_from_text",
    "service_urls",
    "urls_from_args",
    "urls_from_text",
]

# the logger these events had before the URLs left deepdive.rollout_settings: filters keep working
logger = logging.getLogger("deepdive.rollout_settings")

# The services' URLs: the tool server's, node by node, each node's workers; the reward servers'.
Nodes = tuple[tuple[str, ...], ...]
# The one string spelling, only for an environment variable (DEEPDIVE_TOOL_SERVER_URL):
# a node's workers joined by WORKERS, the nodes by NODES ("http://a:1,http://a:2;http://b:1").
WORKERS, NODES = ",", ";"


def service_urls(tool_server_url: Nodes, reward_server_url: tuple[str, ...]) -> dict[str, Any]:
    """The services' URLs under their `args` names, checked (`checked_nodes`, `checked_urls`)
    and as lists, which YAML writes and slime sets on `args` as they are."""
    nodes = checked_nodes(arg_name("tool_server_url"), tool_server_url)
    rewards = checked_urls(arg_name("reward_server_url"), reward_server_url)
    return {
        arg_name("tool_server_url"): [list(node) for node in nodes],
        arg_name("reward_server_url"): list(rewards),
    }


# The endpoints under each base URL, as DeepDive's DEEPDIVE_TOOL_SERVER_URL and
# DEEPDIVE_REWARD_SERVER_URL spell them; the longer suffix first.
ENDPOINTS: dict[str, tuple[str, ...]] = {
    "tool_server_url": ("/tool",),
    "reward_server_url": ("/evaluate/batch", "/evaluate"),
}


def endpoint_base(key: str, url: str) -> str:
    """`url` without a trailing endpoint of `key`'s service (`http://h:8700/tool` ->
    `http://h:8700`; a trailing slash is allowed). Strict: only whole segments in `ENDPOINTS`
    are taken off, and a URL with a query or a fragment is kept as given."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url  # RolloutSettings.__post_init__ names the key and refuses it
    if parts.query or parts.fragment:
        return url
    path = parts.path.rstrip("/")
    for suffix in ENDPOINTS.get(key, ()):
        if path.endswith(suffix):
            log_event(logger, "service_url_normalised", setting=arg_name(key), dropped=suffix)
            return urlunsplit(parts._replace(path=path.removesuffix(suffix)))
    return url


def check_url(key: str, url: object, where: str = "") -> None:
    """One http(s) URL (the SGLang router's, or one of a list's), never several joined."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{key}: {where}expected an http(s) URL, got {url!r}")
    if WORKERS in url or NODES in url:
        raise ConfigError(
            f"{key}: {where}one URL each, without {WORKERS!r} or {NODES!r} (a list holds "
            f"several), got {url!r}"
        )


def checked_urls(key: str, value: object, where: str = "") -> tuple[str, ...]:
    """A non-empty list (or tuple) of distinct http(s) URLs, as a tuple; a bad one is named
    with its position."""
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(
            f"{key}: {where}expected a list of http(s) URLs{_hint(key, value)}, got {value!r}"
        )
    for position, url in enumerate(value, start=1):
        check_url(key, url, f"{where}URL {position} of {len(value)}: ")
    urls = tuple(value)
    if len(set(urls)) != len(urls):
        raise ConfigError(f"{key}: {where}the same URL is listed twice in {value!r}")
    return urls


def checked_nodes(key: str, value: object) -> Nodes:
    """A non-empty list of nodes, each a list of its workers' URLs (`checked_urls`), as tuples;
    a bad node is named with its position, and no URL may be listed twice."""
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(
            f"{key}: expected a list of nodes, each a list of its workers' http(s) URLs"
            f"{_hint(key, value)}, got {value!r}"
        )
    nodes = tuple(
        checked_urls(key, node, f"node {position} of {len(value)}: ")
        for position, node in enumerate(value, start=1)
    )
    every = [url for node in nodes for url in node]
    if len(set(every)) != len(every):
        raise ConfigError(f"{key}: the same URL is listed twice in {value!r}")
    return nodes


def _hint(key: str, value: object) -> str:
    return f" (a string only in {env_name(key)})" if isinstance(value, str) else ""


def urls_from_text(field: str, text: str) -> tuple[str, ...]:
    """The one string spelling of a list of URLs, for an environment variable
    (DEEPDIVE_REWARD_SERVER_URL): joined by commas, blanks around each ignored, each URL's
    trailing endpoint taken off (`endpoint_base`); checked as `checked_urls` does."""
    urls = [endpoint_base(field, url.strip()) for url in text.split(WORKERS)]
    return checked_urls(arg_name(field), urls)


def nodes_from_text(field: str, text: str) -> Nodes:
    """The one string spelling of the tool server's nodes, for DEEPDIVE_TOOL_SERVER_URL: each
    node's workers as `urls_from_text` reads them, the nodes joined by semicolons
    ("http://a:1,http://a:2;http://b:1"; one URL is one node of one worker); checked as
    `checked_nodes` does."""
    nodes = [
        [endpoint_base(field, url.strip()) for url in node.split(WORKERS)]
        for node in text.split(NODES)
    ]
    return checked_nodes(arg_name(field), nodes)


def urls_from_args(args: Any, field: str) -> Any:
    """The setting from `args` (lists: a YAML file's, the local backend's), each URL's
    trailing endpoint taken off; else the environment variable's one string spelling; else
    None, which validation names. Anything else is left for validation to name."""
    value = getattr(args, arg_name(field), None)
    if value is not None:
        return _endpoint_bases(field, value)
    text = os.environ.get(env_name(field))
    if text is None:
        return None
    if field == "tool_server_url":
        return nodes_from_text(field, text)
    return urls_from_text(field, text)


def _endpoint_bases(field: str, value: Any) -> Any:
    if isinstance(value, str):
        return endpoint_base(field, value)
    if isinstance(value, list | tuple):
        return [_endpoint_bases(field, item) for item in value]
    return value
