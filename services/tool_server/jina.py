"""Pages through the Jina reader: GET {base}/{url}, JSON {code, data: {title, url, content}}.

Jina fetches the page, not us; the URL still passes the guard's syntax check (http/https, no
literal private address) so the model cannot aim the reader at an internal host.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.base.errors import UpstreamBadResponse
from services.base.logs import register_secret
from services.client.http import (
    Upstream,
    UpstreamProvider,
    UpstreamReply,
    UpstreamSettings,
    decode_json_object,
)
from services.serving.metrics import ServiceMetrics
from services.tool_server.models import Page
from services.tool_server.providers import ensure_readable
from services.tool_server.urlguard import URLGuard

KEY_ENV = "JINA_API_KEY"
DEFAULT_URL = "https://r.jina.ai"
# Requests in flight at most. Jina Reader's documented rate limits are per minute (20 RPM
# without a key, 500 RPM with one, 5,000 RPM on premium keys) and a page takes ~2-5 s to read:
# 500 RPM x ~4 s is ~33 in flight, premium ~330. 64 serves a keyed account without idling;
# past its limit Jina answers 429, which the client backs off from.
DEFAULT_CONCURRENCY = 64
_MAX_READER_TIMEOUT_S = 30


class JinaReader(UpstreamProvider):
    name = "jina"
    key_env = KEY_ENV

    def __init__(
        self,
        settings: UpstreamSettings,
        api_key: str | None,
        guard: URLGuard,
        *,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.guard = guard
        headers = {"Accept": "application/json", "X-Return-Format": "markdown"}
        register_secret(api_key)  # a page can echo our request headers back
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        upstream = Upstream(
            self.name,
            dataclasses.replace(settings, pool_connections=False),  # a connection per page
            headers=headers,
            metrics=metrics,
            key_hint=KEY_ENV,
            through_proxy=True,  # on the internet: HTTPS_PROXY / NO_PROXY apply
        )
        super().__init__(upstream, has_key=api_key is not None)

    async def read(self, url: str, deadline: float) -> Page:
        target = self.guard.check_syntax(url)
        reader_timeout = str(min(_MAX_READER_TIMEOUT_S, int(self.upstream.settings.read_timeout_s)))
        reply = await self.upstream.send(
            "GET", f"/{target}", headers={"X-Timeout": reader_timeout}, deadline=deadline
        )
        data = self._decode(reply, url).get("data")
        if not isinstance(data, dict) or not isinstance(data.get("content"), str):
            raise UpstreamBadResponse(self.name, "the response has no data.content")
        title = data.get("title")
        page = Page(
            url=str(data.get("url") or url),
            title=title if isinstance(title, str) else "",
            text=data["content"],
        )
        return ensure_readable(page, self.name)

    def _decode(self, reply: UpstreamReply, url: str) -> dict[str, Any]:
        """The JSON body. A bot challenge (Cloudflare's HTML, served with HTTP 200 in place of
        Jina's JSON) is the page being unavailable, told the model as such, not a broken reply."""
        try:
            return decode_json_object(reply.content, self.name)
        except UpstreamBadResponse:
            text = reply.text()
            if text.strip():
                ensure_readable(Page(url=url, title="", text=text), self.name)
            raise
