"""The tools themselves: search, click, open (and DeepDive's start/close_session).

Each call gets one total deadline. Results pass the domain blocklist and the leakage filter
before the model sees them; the filter runs per request (each task forbids its own texts), on
values that are cached across requests.
"""

from __future__ import annotations

import asyncio
import time
import unicodedata
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from deepdive.protocol import (
    BROWSING_TOOLS,
    ProtocolError,
    ToolRequest,
    format_page,
    format_results,
    split_pages,
    validate_arguments,
)
from services.base.errors import (
    ContentBlocked,
    DeadlineExceeded,
    InvalidArguments,
    InvalidLinkId,
    SessionLost,
    UnknownTool,
)
from services.cache import AsyncCache, CacheOutcome
from services.serving.metrics import ServiceMetrics
from services.tool_server.config import ToolServerConfig
from services.tool_server.leakage import DomainBlocklist, LeakageFilter, normalize
from services.tool_server.models import (
    Page,
    PreparedPage,
    SearchResult,
    results_nbytes,
)
from services.tool_server.providers import PageReader, SearchProvider
from services.tool_server.sessions import SessionStore
from services.tool_server.urls import normalize_url


@dataclass(frozen=True)
class ToolOutcome:
    text: str
    cache: CacheOutcome | None = None


class ToolExecutor:
    def __init__(
        self,
        config: ToolServerConfig,
        search: SearchProvider,
        reader: PageReader,
        metrics: ServiceMetrics | None = None,
        replacement: bool = False,
    ) -> None:
        """`replacement`: this executor's worker replaces one that died (its sessions' state
        went with it: services/tool_server/sessions.py)."""
        self.config = config
        self.search_provider = search
        self.reader = reader
        self.search_cache: AsyncCache[tuple[SearchResult, ...]] = AsyncCache(
            "search", config.search_cache, metrics, sizeof=results_nbytes
        )
        self.page_cache: AsyncCache[PreparedPage] = AsyncCache(
            "page", config.page_cache, metrics, sizeof=lambda page: page.nbytes
        )
        self.sessions = SessionStore(config.sessions, replacement=replacement)
        self.blocklist = DomainBlocklist(config.blocked_domains)
        self._handlers: dict[str, Callable[[ToolRequest, float], Awaitable[ToolOutcome]]] = {
            "search": self._search,
            "click": self._click,
            "open": self._open,
            "start_session": self._start_session,
            "close_session": self._close_session,
        }
        self.tool_names = frozenset(
            self._handlers
        )  # what `call` accepts; metrics label the rest "unknown"

    async def aclose(self) -> None:
        await self.search_provider.aclose()
        await self.reader.aclose()

    def not_ready_reasons(self) -> dict[str, str]:
        reasons = {}
        for role, provider in (("search", self.search_provider), ("reader", self.reader)):
            reason = provider.not_ready_reason()
            if reason:
                reasons[f"{role}:{provider.name}"] = reason
        return reasons

    async def call(self, request: ToolRequest) -> ToolOutcome:
        """Run one tool call within the deadline. Raises `ToolError` for the model to read."""
        handler = self._handlers.get(request.name)
        if handler is None:
            raise UnknownTool(
                f"unknown tool {request.name[:64]!r}; the tools are {', '.join(BROWSING_TOOLS)}"
            )
        budget = self.config.call_deadline_s
        try:
            # asyncio's own timeout: anyio's cancel scope costs ~9 % of a cached call's CPU
            async with asyncio.timeout(budget):
                return await handler(request, time.monotonic() + budget)
        except TimeoutError:
            raise DeadlineExceeded(
                f"{request.name} took longer than {budget:g}s and was stopped; try again or "
                "try something else"
            ) from None
        finally:
            self.sessions.served(request.session_id)

    async def _search(self, request: ToolRequest, deadline: float) -> ToolOutcome:
        args = _validated(request)
        query: str = args["query"]
        _check_length("query", query, self.config.max_query_chars)
        num = min(args["num"] or self.config.default_results, self.config.max_results)
        key = (self.search_provider.name, normalize_query(query), num)

        async def fetch() -> tuple[SearchResult, ...]:
            return tuple(await self.search_provider.search(query, num, deadline))

        results, outcome = await self.search_cache.get_or_compute(key, fetch)
        leakage = LeakageFilter(request.forbidden_texts, self.config.leakage_ngram)
        shown = tuple(
            r
            for r in results
            if not self.blocklist.blocks(r.url) and not (leakage and leakage.matches(r.normalized))
        )
        self.sessions.remember_results(request.session_id, shown)
        return ToolOutcome(format_results(shown), outcome)

    async def _click(self, request: ToolRequest, deadline: float) -> ToolOutcome:
        args = _validated(request)
        link_id: int = args["link_id"]
        results = self.sessions.latest_results(request.session_id)
        if not results and self.sessions.lost(request.session_id):
            raise SessionLost(
                "this session's search results were lost: the tool server restarted since "
                "your last search; search again, then click"
            )
        if not results:
            raise InvalidLinkId(
                "there are no search results to click in this session; call search first"
            )
        if link_id > len(results):
            raise InvalidLinkId(
                f"link_id {link_id} is not among the latest results (1 to {len(results)})"
            )
        return await self._show(results[link_id - 1].url, args["page"], request, deadline)

    async def _open(self, request: ToolRequest, deadline: float) -> ToolOutcome:
        args = _validated(request)
        _check_length("url", args["url"], self.config.max_url_chars)
        return await self._show(args["url"], args["page"], request, deadline)

    async def _show(
        self, url: str, page_number: int, request: ToolRequest, deadline: float
    ) -> ToolOutcome:
        if self.blocklist.blocks(url):
            raise ContentBlocked("this site is blocked for this task; use another source")

        async def fetch() -> PreparedPage:
            page = await self.reader.read(url, deadline)
            return await prepare_page(page, self.config.page_chars, self.config.max_page_chars)

        page, outcome = await self.page_cache.get_or_compute(
            (self.reader.name, normalize_url(url)), fetch
        )
        if self.blocklist.blocks(page.url):
            raise ContentBlocked("this page redirects to a blocked site; use another source")
        leakage = LeakageFilter(request.forbidden_texts, self.config.leakage_ngram)
        if leakage and leakage.matches(page.normalized):
            raise ContentBlocked(
                "this page contains the task's own text and cannot be shown; use another source"
            )
        if page_number > len(page.pieces):
            raise InvalidArguments(
                f"page {page_number} is past the end: this page has {len(page.pieces)} page(s)"
            )
        return ToolOutcome(format_page(page, page.pieces, page_number, page.cut_at), outcome)

    async def _start_session(self, request: ToolRequest, deadline: float) -> ToolOutcome:
        return ToolOutcome("Successfully started session.")

    async def _close_session(self, request: ToolRequest, deadline: float) -> ToolOutcome:
        self.sessions.close(request.session_id)
        return ToolOutcome(f"Successfully closed session {request.session_id}.")


# Pages longer than this are prepared in a worker thread, so the event loop keeps serving.
_PREPARE_IN_THREAD_CHARS = 50_000


async def prepare_page(page: Page, page_chars: int, max_page_chars: int) -> PreparedPage:
    """Cut, split and normalise a fetched page once, off the event loop when it is large."""
    if len(page.text) + len(page.title) <= _PREPARE_IN_THREAD_CHARS:
        return _prepare(page, page_chars, max_page_chars)
    return await anyio.to_thread.run_sync(_prepare, page, page_chars, max_page_chars)


def _prepare(page: Page, page_chars: int, max_page_chars: int) -> PreparedPage:
    cut = len(page.text) > max_page_chars
    text = page.text[:max_page_chars] if cut else page.text
    return PreparedPage(
        url=page.url,
        title=page.title,
        pieces=tuple(split_pages(text, page_chars)),
        normalized=normalize(f"{page.title}\n{text}"),
        cut_at=max_page_chars if cut else None,
    )


def _check_length(field: str, value: str, limit: int) -> None:
    """Model-chosen strings are bounded at the door: they become cache keys and upstream calls."""
    if len(value) > limit:
        raise InvalidArguments(
            f"the {field} is {len(value)} characters long; at most {limit} are accepted"
        )


def normalize_query(query: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", query).casefold().split())


def _validated(request: ToolRequest) -> dict[str, Any]:
    """The call's arguments checked by the shared protocol (the rollout and reward use it too)."""
    try:
        return validate_arguments(request.name, request.arguments)
    except ProtocolError as error:
        raise InvalidArguments(error.message) from None
