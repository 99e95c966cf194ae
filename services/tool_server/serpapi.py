"""Google results through SerpAPI: GET /search.json, the key in the query string.

SerpAPI reports some errors inside an HTTP 200 body ({"error": "..."}), including the benign
"no results" case, and reports exhausted credit as a 429, which no retry fixes.
"""

from __future__ import annotations

import httpx

from services.exceptions import UpstreamAuthError, UpstreamBadResponse, UpstreamError
from services.http import Upstream, UpstreamReply, UpstreamSettings
from services.logs import redact, register_secret
from services.metrics import ServiceMetrics
from services.tool_server.models import SearchResult
from services.tool_server.providers import decode_json_object, results_from_items

KEY_ENV = "SERPAPI_API_KEY"
DEFAULT_URL = "https://serpapi.com"
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


class SerpApiSearch:
    name = "serpapi"

    def __init__(
        self,
        settings: UpstreamSettings,
        api_key: str | None,
        *,
        gl: str | None = None,
        hl: str | None = None,
        metrics: ServiceMetrics | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._api_key = api_key
        register_secret(api_key)  # it travels in the query string: keep it out of every message
        self._locale = {k: v for k, v in (("gl", gl), ("hl", hl)) if v}
        self.upstream = Upstream(
            self.name,
            settings,
            metrics=metrics,
            transport=transport,
            key_hint=KEY_ENV,
            classify_error=_classify,
        )

    async def search(self, query: str, num: int, deadline: float) -> list[SearchResult]:
        params = {
            "engine": "google",
            "q": query,
            "num": str(num),
            "start": "0",
            "api_key": self._api_key or "",
            **self._locale,
        }
        reply = await self.upstream.send("GET", "/search.json", params=params, deadline=deadline)
        data = decode_json_object(reply.content, self.name)
        error = data.get("error")
        if error is not None:
            if _NO_RESULTS in str(error):
                return []
            raise UpstreamBadResponse(self.name, f"API error: {redact(str(error))[:200]}")
        return results_from_items(data.get("organic_results"), self.name, num)

    def not_ready_reason(self) -> str | None:
        if self._api_key is None:
            return f"{KEY_ENV} is not set"
        return self.upstream.auth_failure

    async def aclose(self) -> None:
        await self.upstream.aclose()
