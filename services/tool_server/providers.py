"""What a search provider and a page reader are, and the parsing helpers they share."""

from __future__ import annotations

import re
from typing import Any, Protocol

from services.base.errors import PageUnavailable, UpstreamBadResponse
from services.tool_server.models import Page, SearchResult


class SearchProvider(Protocol):
    name: str

    async def search(self, query: str, num: int, deadline: float) -> list[SearchResult]:
        """Up to `num` results, best first. Raises a `ToolError` on failure."""
        ...

    def not_ready_reason(self) -> str | None:
        """None when the provider can serve, else why not (missing key, failed auth)."""
        ...

    async def aclose(self) -> None: ...


class PageReader(Protocol):
    name: str

    async def read(self, url: str, deadline: float) -> Page:
        """The whole page as text. Raises a `ToolError` on failure."""
        ...

    def not_ready_reason(self) -> str | None: ...

    async def aclose(self) -> None: ...


def search_locale(gl: str | None, hl: str | None) -> dict[str, str]:
    """The country (gl) and language (hl) parameters both Google APIs take, when set."""
    return {key: value for key, value in (("gl", gl), ("hl", hl)) if value}


def results_from_items(items: Any, upstream: str, num: int) -> list[SearchResult]:
    """SearchResults from a list of {title, link, snippet} objects; entries without a link are skipped."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise UpstreamBadResponse(upstream, "the result list is not a list")
    results = []
    for item in items:
        if not isinstance(item, dict):
            continue
        link = item.get("link")
        if not isinstance(link, str) or not link.strip():
            continue
        results.append(
            SearchResult(
                title=_text(item.get("title")),
                url=link.strip(),
                snippet=_text(item.get("snippet")),
            )
        )
    return results[:num]


def _text(value: Any) -> str:
    return " ".join(value.split()) if isinstance(value, str) else ""


_CHALLENGE = re.compile(
    r"just a moment\.\.\.|attention required! \| cloudflare|checking your browser before accessing"
    r"|enable javascript and cookies to continue|cf-browser-verification|challenge-platform"
    r"|verify you are human|ddos protection by cloudflare",
    re.IGNORECASE,
)


CHALLENGE_MESSAGE = (
    "{upstream}: the site answered with a bot-protection challenge instead of the page; "
    "try another result"
)


def looks_like_challenge(text: str) -> bool:
    """A bot-protection page (Cloudflare's and its kind) rather than the page asked for."""
    return _CHALLENGE.search(text) is not None


def ensure_readable(page: Page, upstream: str) -> Page:
    """Refuse bot-challenge pages and empty pages, which some sites serve with HTTP 200."""
    if looks_like_challenge(f"{page.title}\n{page.text[:3000]}"):
        raise PageUnavailable(CHALLENGE_MESSAGE.format(upstream=upstream))
    if not page.text.strip():
        raise PageUnavailable(f"{upstream}: the page has no readable text")
    return page
