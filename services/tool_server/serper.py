"""Google results through Serper: POST /search with the key in the X-API-KEY header."""

from __future__ import annotations

from typing import Any

import httpx

from services.http import Upstream, UpstreamSettings
from services.metrics import ServiceMetrics
from services.tool_server.models import SearchResult
from services.tool_server.providers import decode_json_object, results_from_items

KEY_ENV = "SERPER_API_KEY"
DEFAULT_URL = "https://google.serper.dev"


class SerperSearch:
    name = "serper"

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
        self._has_key = api_key is not None
        self._locale = {k: v for k, v in (("gl", gl), ("hl", hl)) if v}
        headers = {"X-API-KEY": api_key} if api_key else {}
        self.upstream = Upstream(
            self.name,
            settings,
            headers=headers,
            metrics=metrics,
            transport=transport,
            key_hint=KEY_ENV,
        )

    async def search(self, query: str, num: int, deadline: float) -> list[SearchResult]:
        payload: dict[str, Any] = {"q": query, "num": num, **self._locale}
        reply = await self.upstream.send("POST", "/search", json=payload, deadline=deadline)
        data = decode_json_object(reply.content, self.name)
        return results_from_items(data.get("organic"), self.name, num)

    def not_ready_reason(self) -> str | None:
        if not self._has_key:
            return f"{KEY_ENV} is not set"
        return self.upstream.auth_failure

    async def aclose(self) -> None:
        await self.upstream.aclose()
