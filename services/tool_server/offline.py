"""The embedded default: search and pages from a local corpus, no key, no network."""

from __future__ import annotations

from services.base.errors import PageNotFound
from services.tool_server.corpus import CorpusIndex, Document
from services.tool_server.models import Page, SearchResult
from services.tool_server.urls import normalize_url

SNIPPET_CHARS = 280


def snippet_of(text: str, limit: int = SNIPPET_CHARS) -> str:
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat.rfind(" ", 0, limit)
    return flat[: cut if cut > limit // 2 else limit] + " ..."


class OfflineSearch:
    """BM25 over the corpus. Runs inline: a query over ~10k documents takes about a millisecond."""

    name = "offline"

    def __init__(self, index: CorpusIndex) -> None:
        self.index = index

    async def search(self, query: str, num: int, deadline: float) -> list[SearchResult]:
        return [_result(doc) for doc in self.index.search(query, num)]

    def not_ready_reason(self) -> str | None:
        return None

    async def aclose(self) -> None:
        return None


class OfflineReader:
    name = "offline"

    def __init__(self, index: CorpusIndex) -> None:
        self.index = index

    async def read(self, url: str, deadline: float) -> Page:
        doc = self.index.by_url.get(normalize_url(url))
        if doc is None:
            raise PageNotFound(
                f"no page at {url} in the offline corpus; open a URL from your search results"
            )
        return Page(url=doc.url, title=doc.title, text=doc.text)

    def not_ready_reason(self) -> str | None:
        return None

    async def aclose(self) -> None:
        return None


def _result(doc: Document) -> SearchResult:
    return SearchResult(title=doc.title, url=doc.url, snippet=snippet_of(doc.text))
