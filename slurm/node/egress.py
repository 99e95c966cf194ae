"""The egress probe: one real search and one real read through a node's own tool server, made
in the node's `services` phase before Ray starts (slurm/bootstrap.py).

A node that cannot reach its upstreams (no route out, a name that does not resolve, a proxy
that is gone or refuses, a key the provider refuses) then fails at start-up naming the
upstream and why, instead of every rollout's tool calls failing minutes later. The calls go
through the tool server the node just started, so they use what its rollouts will use: its
environment (HTTPS_PROXY / NO_PROXY, the env file's keys), its providers, its retries.

Only a tool server whose world leaves the cluster is probed (search serper / serpapi, reader
jina / direct); the offline world answers from its own corpus. The cost: one search and one
read per node and attempt. `services.egress_probe = false` turns it off.

The read clicks the search's first result, as an agent would; a search without results opens
FALLBACK_URL. A page the reader fetched but could not show (a bot challenge, an empty page,
the leakage filter) still proves the way out: every other failure fails the probe.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from services.base.errors import DeepDiveError, RuntimeFailure
from services.base.logs import redact
from services.base.secrets import PROXY_ENVS

if TYPE_CHECKING:
    from deepdive.protocol import ToolReply

OFFLINE = "offline"  # ToolServerConfig's default search and reader: the node's own corpus
PROBE_QUERY = "Alan Turing"
FALLBACK_URL = "https://en.wikipedia.org/wiki/Alan_Turing"
# A read that failed with one of these reached the page's site (or the reader that fetched it).
READ_ANSWERED = frozenset({"page_unavailable", "content_blocked"})
NO_RESULTS_CODE = "invalid_link_id"  # a click in a session whose search found nothing


class EgressFailed(RuntimeFailure):
    """The egress probe's search or read failed: the node cannot reach an upstream."""

    code = "egress_failed"


@dataclass(frozen=True)
class Upstreams:
    """A tool server's providers, as its config table names them."""

    search: str = OFFLINE
    reader: str = OFFLINE

    @classmethod
    def of(cls, table: Mapping[str, Any]) -> Upstreams:
        return cls(str(table.get("search", OFFLINE)), str(table.get("reader", OFFLINE)))

    @property
    def offline(self) -> bool:
        """True when nothing leaves the cluster: no probe is needed."""
        return self.search == OFFLINE and self.reader == OFFLINE


@dataclass(frozen=True)
class ProbeResult:
    """What the phase log records of a probe that passed."""

    search: str
    reader: str
    read: str  # the URL read
    seconds: float
    note: str | None = None

    def detail(self) -> dict[str, Any]:
        found = {key: value for key, value in vars(self).items() if value is not None}
        return {**found, "seconds": round(self.seconds, 3)}


def probe_egress(
    url: str,
    upstreams: Upstreams,
    *,
    session: str,
    timeout_s: float,
    token: str | None = None,
    environment: Mapping[str, str] | None = None,
) -> ProbeResult:
    """One search and one read through the tool server at `url` (its first worker: the click
    needs the session the search left); raises EgressFailed naming the tool, the provider and
    the upstream's error (secrets redacted). `environment`: the tool server's, to name the
    proxy it went through."""
    # imported here: every node imports this module, only a node on the internet probes
    import httpx

    from deepdive.protocol import ToolReply, ToolRequest

    started = time.monotonic()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    route = proxy_route(environment or {})
    with httpx.Client(base_url=url, headers=headers, timeout=timeout_s, trust_env=False) as client:

        def call(name: str, provider: str, arguments: dict[str, Any]) -> ToolReply:
            request = ToolRequest(session, name, arguments)
            try:
                response = client.post("/tool", json=request.as_json())
                response.raise_for_status()
                return ToolReply.parse(response.json())
            except (httpx.HTTPError, ValueError, DeepDiveError) as error:
                raise EgressFailed(
                    f"the egress probe's {name} ({provider}) got no answer from the tool server "
                    f"at {url}: {_words(error)}"
                ) from None

        def failed(name: str, provider: str, reply: ToolReply) -> EgressFailed:
            assert reply.error is not None
            return EgressFailed(
                f"the egress probe's {name} through {provider} failed ({route}): "
                f"{redact(reply.error.message)}; services.egress_probe = false turns the "
                "probe off"
            )

        searched = call("search", upstreams.search, {"query": PROBE_QUERY, "num": 1})
        if searched.error is not None:
            raise failed("search", upstreams.search, searched)
        read, note = "result 1", None
        reply = call("click", upstreams.reader, {"link_id": 1})
        if reply.error is not None and reply.error.code == NO_RESULTS_CODE:
            read = FALLBACK_URL
            reply = call("open", upstreams.reader, {"url": FALLBACK_URL})
        if reply.error is not None and reply.error.code in READ_ANSWERED:
            note = f"the page was fetched but not shown: {redact(reply.error.message)}"
        elif reply.error is not None:
            raise failed("read", upstreams.reader, reply)
        call("close_session", upstreams.reader, {})
    return ProbeResult(upstreams.search, upstreams.reader, read, time.monotonic() - started, note)


def proxy_route(environment: Mapping[str, str]) -> str:
    """How the tool server leaves the node, as its environment says (user and password
    dropped): "through the proxy http://proxy:3128 (HTTPS_PROXY)" or "no proxy set"."""
    for name in PROXY_ENVS:
        value = environment.get(name, "").strip()
        if value:
            return f"through the proxy {_without_credentials(value)} ({name})"
    return "no proxy set"


def _without_credentials(url: str) -> str:
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
    except ValueError:
        return "(not a URL)"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _words(error: BaseException) -> str:
    text = getattr(error, "message", None) or f"{type(error).__name__}: {error}"
    return redact(str(text))
