"""Google results through SerpAPI: GET /search.json, the key in the query string.

SerpAPI reports some errors inside an HTTP 200 body ({"error": "..."}), including the benign
"no results" case, and reports exhausted credit as a 429, which no retry fixes.
"""

from __future__ import annotations

from typing import Any

from services.base.errors import UpstreamAuthError, UpstreamBadResponse, UpstreamError
from services.base.logs import redact, register_secret
from services.client.http import (
    Upstream,
    UpstreamProvider,
    UpstreamReply,
    UpstreamSettings,
    decode_json_object,
    echoed_query,
)
from services.serving.metrics import ServiceMetrics
from services.tool_server.models import SearchResult
from services.tool_server.providers import results_from_items, search_locale

KEY_ENV = "SERPAPI_API_KEY"
DEFAULT_URL = "https://serpapi.com"
# Requests in flight at most. SerpAPI's plans allow roughly 1-15 searches per second (their
# hourly throughput limits) and a search takes ~2-3 s: 15/s x ~2 s is ~32 in flight.
DEFAULT_CONCURRENCY = 32
_NO_RESULTS = "hasn't returned any results"
_OUT_OF_CREDIT = ("run out of searches", "plan", "credit")


def _classify(reply: UpstreamReply) -> UpstreamError | None:
    if reply.status_code != 429:
        return None
    try:
        message = str(decode_json_object(reply.content, "serpapi").get("error", ""))
    except UpstreamBadResponse:
        return None
    if any(marker in message.lower() for marker in _OUT_OF_CREDIT):
        return UpstreamAuthError("serpapi", "the account has run out of searches")
    return None


class SerpApiSearch(UpstreamProvider):
    name = "serpapi"
    key_env = KEY_ENV
    key_required = True

    def __init__(
        self,
        settings: UpstreamSettings,
        api_key: str | None,
        *,
        gl: str | None = None,
        hl: str | None = None,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self._api_key = api_key
        register_secret(api_key)  # it travels in the query string: keep it out of every message
        self._locale = search_locale(gl, hl)
        upstream = Upstream(
            self.name,
            settings,
            metrics=metrics,
            key_hint=KEY_ENV,
            classify_error=_classify,
            through_proxy=True,  # on the internet: HTTPS_PROXY / NO_PROXY apply
        )
        super().__init__(upstream, has_key=api_key is not None)

    async def search(self, query: str, num: int, deadline: float) -> list[SearchResult]:
        params = {
            "engine": "google",
            "q": query,
            "num": str(num),
            "start": "0",
            "api_key": self._api_key or "",
            **self._locale,
        }
        replies: list[dict[str, Any]] = []

        def check(reply: UpstreamReply) -> None:  # SerpAPI repeats it in search_parameters.q
            replies.append(echoed_query(reply, self.name, "search_parameters", query))

        await self.upstream.send(
            "GET", "/search.json", params=params, deadline=deadline, check=check
        )
        data = replies[-1]
        error = data.get("error")
        if error is not None:
            if _NO_RESULTS in str(error):
                return []
            raise UpstreamBadResponse(self.name, f"API error: {redact(str(error))[:200]}")
        return results_from_items(data.get("organic_results"), self.name, num)
