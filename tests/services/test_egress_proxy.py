"""Upstreams on the internet go through the proxy the environment names; in-cluster hops never.

Most GPU nodes reach the internet only through a site proxy (HTTPS_PROXY / HTTP_PROXY, with
NO_PROXY for what is inside). The fake Serper and Jina here live at `*.invalid` hosts, which
do not resolve: a real loopback proxy (fakes/forward_proxy.py) maps them to the fake, so an
answer proves the request went through it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from pytest_httpserver import HTTPServer

from fakes.forward_proxy import ForwardProxy
from services.base.errors import UpstreamUnavailable
from services.base.logs import redact
from services.client.http import Upstream, UpstreamSettings
from services.client.retries import RetryPolicy
from services.tool_server.jina import JinaReader
from services.tool_server.serper import SerperSearch
from services.tool_server.urlguard import URLGuard
from tests.helpers import Closing

PROXY_ENVS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
FAST = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02)
SERPER_BODY = {
    "searchParameters": {"q": "orrery"},
    "organic": [
        {"title": "Orrery", "link": "https://en.wikipedia.org/wiki/Orrery", "snippet": "A model"}
    ],
}
JINA_BODY = {
    "code": 200,
    "data": {"title": "Site", "url": "https://site.example/", "content": "Hello page"},
}


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*PROXY_ENVS, "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("NETRC", raising=False)
    return monkeypatch


@pytest.fixture
async def proxy(httpserver: HTTPServer) -> AsyncIterator[ForwardProxy]:
    routes = {name: ("127.0.0.1", httpserver.port) for name in ("serper.invalid", "jina.invalid")}
    server = ForwardProxy(routes)
    await server.start()
    yield server
    await server.aclose()


def settings(url: str) -> UpstreamSettings:
    return UpstreamSettings(url, retry=FAST, read_timeout_s=5, connect_timeout_s=2)


def deadline() -> float:
    return time.monotonic() + 10


@pytest.mark.anyio
async def test_search_and_read_reach_hosts_only_the_proxy_can(
    httpserver: HTTPServer, proxy: ForwardProxy, no_proxy_env: pytest.MonkeyPatch, closing: Closing
) -> None:
    httpserver.expect_request("/search", method="POST").respond_with_json(SERPER_BODY)
    httpserver.expect_request("/https://site.example/").respond_with_data(
        json.dumps(JINA_BODY), content_type="application/json"
    )
    no_proxy_env.setenv("HTTP_PROXY", proxy.url)
    search = closing(SerperSearch(settings("http://serper.invalid"), "serper-key-123"))
    reader = closing(JinaReader(settings("http://jina.invalid"), None, URLGuard()))
    results = await search.search("orrery", 5, deadline())
    page = await reader.read("https://site.example/", deadline())
    assert [r.title for r in results] == ["Orrery"] and page.text == "Hello page"
    assert proxy.seen == ["serper.invalid:80", "jina.invalid:80"]


@pytest.mark.anyio
@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "localhost,127.0.0.1,.cluster"])
async def test_no_proxy_sends_a_host_direct(
    httpserver: HTTPServer,
    proxy: ForwardProxy,
    no_proxy_env: pytest.MonkeyPatch,
    closing: Closing,
    no_proxy: str,
) -> None:
    httpserver.expect_request("/search", method="POST").respond_with_json(SERPER_BODY)
    no_proxy_env.setenv("HTTP_PROXY", proxy.url)
    no_proxy_env.setenv("NO_PROXY", no_proxy)
    search = closing(SerperSearch(settings(httpserver.url_for("")), "serper-key-123"))
    assert [r.title for r in await search.search("orrery", 5, deadline())] == ["Orrery"]
    assert proxy.seen == []


@pytest.mark.anyio
async def test_without_no_proxy_even_a_loopback_search_goes_through_the_proxy(
    httpserver: HTTPServer, proxy: ForwardProxy, no_proxy_env: pytest.MonkeyPatch, closing: Closing
) -> None:
    httpserver.expect_request("/search", method="POST").respond_with_json(SERPER_BODY)
    no_proxy_env.setenv("http_proxy", proxy.url)  # the lower-case spelling too
    search = closing(SerperSearch(settings(httpserver.url_for("")), "serper-key-123"))
    await search.search("orrery", 5, deadline())
    assert proxy.seen == [f"127.0.0.1:{httpserver.port}"]


@pytest.mark.anyio
async def test_an_in_cluster_hop_never_uses_the_proxy(
    httpserver: HTTPServer, no_proxy_env: pytest.MonkeyPatch, closing: Closing
) -> None:
    httpserver.expect_request("/ready").respond_with_json({"ready": True})
    no_proxy_env.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens: used = failure
    for plain_http in (False, True):
        hop = closing(
            Upstream(
                "tool_server", replace(settings(httpserver.url_for("")), plain_http=plain_http)
            )
        )
        assert (await hop.send("GET", "/ready", deadline=deadline())).status_code == 200


@pytest.mark.anyio
async def test_proxy_credentials_are_used_and_never_logged(
    httpserver: HTTPServer,
    no_proxy_env: pytest.MonkeyPatch,
    closing: Closing,
    caplog: pytest.LogCaptureFixture,
) -> None:
    httpserver.expect_request("/search", method="POST").respond_with_json(SERPER_BODY)
    proxy = ForwardProxy(
        {"serper.invalid": ("127.0.0.1", httpserver.port)}, auth=("agent", "pr0xy-pa55word")
    )
    url = (await proxy.start()).replace("http://", "http://agent:pr0xy-pa55word@")
    no_proxy_env.setenv("HTTPS_PROXY", url)
    no_proxy_env.setenv("HTTP_PROXY", url)
    caplog.set_level(logging.INFO, logger="deepdive.upstream")
    search = closing(SerperSearch(settings("http://serper.invalid"), "serper-key-123"))
    try:
        assert [r.title for r in await search.search("orrery", 5, deadline())] == ["Orrery"]
    finally:
        await proxy.aclose()
    assert proxy.seen == ["serper.invalid:80"]
    route = [r.getMessage() for r in caplog.records if "upstream_route" in r.getMessage()]
    assert route == [
        f"upstream_route upstream=serper host=serper.invalid proxy={url.replace('agent:pr0xy-pa55word@', '')}"
    ]
    assert "pr0xy-pa55word" not in caplog.text
    assert redact(f"error from {url}") == f"error from {url.replace('pr0xy-pa55word', '***')}"


@pytest.mark.anyio
async def test_a_proxy_that_is_gone_is_named(
    httpserver: HTTPServer, no_proxy_env: pytest.MonkeyPatch, closing: Closing
) -> None:
    no_proxy_env.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    search = closing(SerperSearch(settings("http://serper.invalid"), "serper-key-123"))
    with pytest.raises(
        UpstreamUnavailable, match=r"could not connect to the proxy \(HTTPS_PROXY\)"
    ):
        await search.search("orrery", 5, deadline())
