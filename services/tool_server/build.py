"""Turn a ToolServerConfig into working providers: read keys, load the corpus, open clients."""

from __future__ import annotations

import logging

from services.base.logs import log_event
from services.base.secrets import read_secret
from services.serving.metrics import ServiceMetrics
from services.tool_server import jina, serpapi, serper
from services.tool_server.config import ToolServerConfig
from services.tool_server.corpus import CorpusIndex, load_corpus
from services.tool_server.direct import DirectReader
from services.tool_server.offline import OfflineReader, OfflineSearch
from services.tool_server.providers import PageReader, SearchProvider
from services.tool_server.urlguard import URLGuard

logger = logging.getLogger("deepdive.tool_server")


def load_index(config: ToolServerConfig, show_progress: bool = False) -> CorpusIndex | None:
    """The offline providers' corpus index (None when neither is configured). A server of
    several workers loads it once, before they are forked: a bad corpus is one error, the
    index is built once, and its memory stays shared until a worker writes to it."""
    if "offline" not in (config.search, config.reader):
        return None
    documents = load_corpus(config.corpus)
    index = CorpusIndex.open(documents, config.index_folder, show_progress=show_progress)
    log_event(logger, "corpus_loaded", documents=len(documents), source=config.corpus or "wiki")
    return index


def build_providers(
    config: ToolServerConfig,
    metrics: ServiceMetrics | None = None,
    show_progress: bool = False,
    index: CorpusIndex | None = None,
) -> tuple[SearchProvider, PageReader]:
    """The configured search provider and page reader (`index`: one `load_index` gave)."""
    if index is None:
        index = load_index(config, show_progress)
    guard = URLGuard(config.allowed_networks)

    search: SearchProvider
    if config.search == "serper":
        search = serper.SerperSearch(
            config.serper,
            read_secret(serper.KEY_ENV),
            gl=config.gl,
            hl=config.hl,
            metrics=metrics,
        )
    elif config.search == "serpapi":
        search = serpapi.SerpApiSearch(
            config.serpapi,
            read_secret(serpapi.KEY_ENV),
            gl=config.gl,
            hl=config.hl,
            metrics=metrics,
        )
    else:
        assert index is not None
        search = OfflineSearch(index)

    reader: PageReader
    if config.reader == "jina":
        reader = jina.JinaReader(config.jina, read_secret(jina.KEY_ENV), guard, metrics=metrics)
    elif config.reader == "direct":
        reader = DirectReader(config.direct, guard, metrics=metrics)
    else:
        assert index is not None
        reader = OfflineReader(index)

    for provider in (search, reader):
        reason = provider.not_ready_reason()
        if reason:
            log_event(
                logger, "provider_not_ready", logging.WARNING, provider=provider.name, reason=reason
            )
    return search, reader
