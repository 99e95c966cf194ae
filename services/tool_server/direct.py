"""Pages fetched by the server itself, for users with internet access but no reader key.

Every hop is checked and pinned by the URL guard; redirects are followed by hand so each new
location is checked before any connection is made to it.
"""

from __future__ import annotations

import dataclasses

import httpx

from services.base.errors import PageUnavailable, ToolError, URLRejected
from services.client.http import Upstream, UpstreamProvider, UpstreamReply, UpstreamSettings
from services.serving.metrics import ServiceMetrics
from services.tool_server.html_text import html_to_text
from services.tool_server.models import Page
from services.tool_server.providers import CHALLENGE_MESSAGE, ensure_readable, looks_like_challenge
from services.tool_server.urlguard import URLGuard

MAX_REDIRECTS = 5
USER_AGENT = "deepdive-slurm/0.1 (research agent reader)"
_TEXT_TYPES = ("text/plain", "text/markdown")


class DirectReader(UpstreamProvider):
    name = "direct"

    def __init__(
        self,
        settings: UpstreamSettings,
        guard: URLGuard,
        *,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.guard = guard
        upstream = Upstream(
            self.name,
            dataclasses.replace(settings, pool_connections=False),  # a connection per page
            headers={"User-Agent": USER_AGENT, "Accept": "text/html,text/plain;q=0.9,*/*;q=0.1"},
            metrics=metrics,
            classify_error=_site_refusal,
            through_proxy=True,  # on the internet: HTTPS_PROXY / NO_PROXY apply
        )
        super().__init__(upstream)

    async def read(self, url: str, deadline: float) -> Page:
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            target = await self.guard.pin(current)
            reply = await self.upstream.send(
                "GET",
                str(target.url),
                headers=target.headers,
                sni_hostname=target.sni_hostname,
                deadline=deadline,
            )
            location = reply.headers.get("location")
            if 300 <= reply.status_code < 400 and location:
                current = _redirect_target(current, location)
                continue
            content_type = reply.headers.get("content-type", "").split(";")[0].strip().lower()
            body = reply.text()
            if content_type in _TEXT_TYPES:
                return ensure_readable(Page(url=current, title="", text=body), self.name)
            if content_type not in ("text/html", "application/xhtml+xml", ""):
                raise PageUnavailable(
                    f"cannot read {content_type or 'this kind of'} content as text"
                )
            title, text = html_to_text(body)
            return ensure_readable(Page(url=current, title=title, text=text), self.name)
        raise URLRejected(f"more than {MAX_REDIRECTS} redirects")


def _redirect_target(current: str, location: str) -> str:
    """The absolute URL a redirect points to; the guard checks it before any connection."""
    try:
        return str(httpx.URL(current).join(location))
    except (httpx.InvalidURL, TypeError, ValueError) as exc:  # e.g. http://0177.0.0.1/
        raise URLRejected(f"the page redirects to an invalid URL: {str(exc)[:200]}") from None


def _site_refusal(reply: UpstreamReply) -> ToolError | None:
    """A site's 4xx is its answer about this page, not a problem with a key we do not have: a
    401/403 (often a bot challenge) must never mark the reader as not ready for every page."""
    if not 400 <= reply.status_code < 500 or reply.status_code == 429:
        return None
    if looks_like_challenge(reply.text()[:3000]):
        return PageUnavailable(CHALLENGE_MESSAGE.format(upstream="direct"))
    return PageUnavailable(f"the site refused the page (HTTP {reply.status_code}); try another")
