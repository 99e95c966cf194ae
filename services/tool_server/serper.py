"""Google results through Serper: POST /search with the key in the X-API-KEY header."""

from __future__ import annotations

from typing import Any

from services.base.logs import register_secret
from services.client.http import (
    Upstream,
    UpstreamProvider,
    UpstreamReply,
    UpstreamSettings,
    echoed_query,
)
from services.serving.metrics import ServiceMetrics
from services.tool_server.models import SearchResult
from services.tool_server.providers import results_from_items, search_locale

KEY_ENV = "SERPER_API_KEY"
DEFAULT_URL = "https://google.serper.dev"
# Requests in flight at most. Serper's plans are sold by queries per second (its pricing page
# lists 50 to 300 QPS, the higher rates on the larger credit packs) and a query takes about
# 0.5-1 s, so by Little's law the largest plan keeps ~150-300 queries in flight: 256 lets a
# 1,024-session node use it, and a smaller plan answers 429 with Retry-After, which the client
# honours (services/client/http.py). The old bound, 32, capped any plan at ~32-64 QPS while the CPU idled.
DEFAULT_CONCURRENCY = 256


class SerperSearch(UpstreamProvider):
    name = "serper"
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
        self._locale = search_locale(gl, hl)
        register_secret(api_key)  # a snippet can echo our request headers back
        headers = {"X-API-KEY": api_key} if api_key else {}
        upstream = Upstream(
            self.name,
            settings,
            headers=headers,
            metrics=metrics,
            key_hint=KEY_ENV,
            through_proxy=True,  # on the internet: HTTPS_PROXY / NO_PROXY apply
        )
        super().__init__(upstream, has_key=api_key is not None)

    async def search(self, query: str, num: int, deadline: float) -> list[SearchResult]:
        payload: dict[str, Any] = {"q": query, "num": num, **self._locale}
        replies: list[dict[str, Any]] = []

        def check(reply: UpstreamReply) -> None:  # Serper repeats it in searchParameters.q
            replies.append(echoed_query(reply, self.name, "searchParameters", query))

        await self.upstream.send("POST", "/search", json=payload, deadline=deadline, check=check)
        return results_from_items(replies[-1].get("organic"), self.name, num)
