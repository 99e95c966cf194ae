"""The tool server's configuration: one typed, validated dataclass with documented defaults."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from deepdive.protocol import PAGE_CHARS
from services.base.errors import ConfigError
from services.base.typed_config import positive
from services.cache import CacheSettings
from services.client.http import UpstreamSettings
from services.serving.connections import ConnectionLimits
from services.serving.supervision import SupervisionPolicy
from services.tool_server import jina, serpapi, serper
from services.tool_server.corpus import default_index_cache
from services.tool_server.leakage import DEFAULT_NGRAM
from services.tool_server.sessions import SessionSettings

SearchBackend = Literal["offline", "serper", "serpapi"]
ReaderBackend = Literal["offline", "jina", "direct"]
SEARCH_BACKENDS: tuple[str, ...] = get_args(SearchBackend)
READER_BACKENDS: tuple[str, ...] = get_args(ReaderBackend)


@dataclass(frozen=True)
class ToolServerConfig:
    """Everything the tool server needs except secrets (those come from the environment only):
    `python -m services tools --config FILE` reads it from a TOML file whose keys are these
    fields (services.base.config_options).

    search / reader       which providers answer search and open/click
    corpus                JSONL {url, title, text} for the offline providers; None = the
                          default Wikipedia corpus of the `corpus` extra
    index_cache           whether BM25 indexes are cached (false: built in memory every start)
    index_cache_dir       where they are cached
    call_deadline_s       total time for one tool call, retries and backoff included
    default_results / max_results   search result counts (`num` is clamped to max_results)
    page_chars            characters per page of `open` output; longer pages are paginated
    max_query_chars       a longer search query is refused (a tool error the model reads)
    max_url_chars         a longer URL is refused likewise
    max_page_chars        a page's text is cut here (the last page says so): the byte size of
                          a cached page is bounded whatever the site serves
    blocked_domains       hosts (and their subdomains) never shown or opened
    allowed_networks      CIDRs the URL guard trusts despite being private (e.g. an intranet mirror)
    leakage_ngram         forbidden texts of at least this many words match by n-gram overlap
    max_body_bytes        larger request bodies are refused with 413
    connections           slow clients and open connections (services.serving.connections)
    supervision           the worker processes' restarts and pings (services.serving.supervision)
    """

    search: SearchBackend = "offline"
    reader: ReaderBackend = "offline"
    corpus: Path | None = None
    index_cache: bool = True
    index_cache_dir: Path = field(default_factory=default_index_cache)
    serper: UpstreamSettings = field(
        default_factory=lambda: UpstreamSettings(
            serper.DEFAULT_URL, max_concurrency=serper.DEFAULT_CONCURRENCY
        )
    )
    serpapi: UpstreamSettings = field(
        default_factory=lambda: UpstreamSettings(
            serpapi.DEFAULT_URL, max_concurrency=serpapi.DEFAULT_CONCURRENCY
        )
    )
    jina: UpstreamSettings = field(
        default_factory=lambda: UpstreamSettings(
            jina.DEFAULT_URL, max_concurrency=jina.DEFAULT_CONCURRENCY
        )
    )
    direct: UpstreamSettings = field(
        default_factory=lambda: UpstreamSettings(
            "", read_timeout_s=20.0, max_response_bytes=5_000_000
        )
    )
    gl: str | None = None
    hl: str | None = None
    call_deadline_s: float = 60.0
    default_results: int = 10
    max_results: int = 20
    page_chars: int = PAGE_CHARS
    max_query_chars: int = 1_000
    max_url_chars: int = 4_096
    max_page_chars: int = 500_000
    search_cache: CacheSettings = field(
        default_factory=lambda: CacheSettings(max_entries=50_000, max_bytes=128 * 2**20)
    )
    page_cache: CacheSettings = field(
        default_factory=lambda: CacheSettings(max_entries=2_000, max_bytes=512 * 2**20)
    )
    sessions: SessionSettings = field(default_factory=SessionSettings)
    blocked_domains: tuple[str, ...] = ()
    allowed_networks: tuple[str, ...] = ()
    leakage_ngram: int = DEFAULT_NGRAM
    max_body_bytes: int = 1_000_000
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    supervision: SupervisionPolicy = field(default_factory=SupervisionPolicy)

    @property
    def index_folder(self) -> Path | None:
        """Where the BM25 indexes are cached; None: built in memory."""
        return self.index_cache_dir if self.index_cache else None

    def __post_init__(self) -> None:
        if self.search not in SEARCH_BACKENDS:
            raise ConfigError(
                f"search: expected one of {', '.join(SEARCH_BACKENDS)}, got {self.search!r}"
            )
        if self.reader not in READER_BACKENDS:
            raise ConfigError(
                f"reader: expected one of {', '.join(READER_BACKENDS)}, got {self.reader!r}"
            )
        positive("call_deadline_s", self.call_deadline_s)
        positive("default_results", self.default_results)
        positive("max_results", self.max_results)
        positive("page_chars", self.page_chars)
        positive("leakage_ngram", self.leakage_ngram)
        positive("max_body_bytes", self.max_body_bytes)
        positive("max_query_chars", self.max_query_chars)
        positive("max_url_chars", self.max_url_chars)
        if self.max_page_chars < self.page_chars:
            raise ConfigError(
                f"max_page_chars: expected at least page_chars ({self.page_chars}), "
                f"got {self.max_page_chars}"
            )
        if self.default_results > self.max_results:
            raise ConfigError("default_results: must not exceed max_results")
        if self.page_chars < 200:
            raise ConfigError(f"page_chars: expected at least 200, got {self.page_chars}")
        for name, settings in (
            ("serper", self.serper),
            ("serpapi", self.serpapi),
            ("jina", self.jina),
            ("direct", self.direct),
        ):
            positive(f"{name}.max_concurrency", settings.max_concurrency)
            positive(f"{name}.read_timeout_s", settings.read_timeout_s)
            positive(f"{name}.retry.max_attempts", settings.retry.max_attempts)
        for cache_name, cache in (
            ("search_cache", self.search_cache),
            ("page_cache", self.page_cache),
        ):
            positive(f"{cache_name}.max_entries", cache.max_entries)
            positive(f"{cache_name}.max_bytes", cache.max_bytes)
            positive(f"{cache_name}.ttl_s", cache.ttl_s)
        positive("sessions.max_sessions", self.sessions.max_sessions)
        positive("sessions.ttl_s", self.sessions.ttl_s)
        for network in self.allowed_networks:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ConfigError(
                    f"allowed_networks: {network!r} is not a network (expected CIDR like 10.1.0.0/16)"
                ) from None
        if self.corpus is not None and not Path(self.corpus).is_file():
            raise ConfigError(f"corpus: {self.corpus} is not a file")
