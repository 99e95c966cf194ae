"""The tool server under uvicorn with paid providers faked by pytest-httpserver."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from services.client.http import UpstreamSettings
from services.client.retries import RetryPolicy
from services.serving.metrics import ServiceMetrics
from services.tool_server.app import create_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.tools import ToolExecutor
from tests.helpers import serve_in_thread, wait_for_requests

SERPER_KEY = "serper-key-0123456789"
SERPAPI_KEY = "serpapi-key-0123456789"
JINA_KEY = "jina-key-0123456789"
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)


def organic(query: str) -> dict[str, Any]:
    return {
        "searchParameters": {"q": query},  # Serper repeats the query it answers
        "organic": [
            {
                "title": f"{query} {i}",
                "link": f"https://r{i}.example/{query.replace(' ', '-')}",
                "snippet": f"about {query}",
            }
            for i in range(1, 4)
        ],
    }


@contextmanager
def tool_server(
    httpserver: HTTPServer, search: str = "serper", read_timeout_s: float = 5, **overrides: Any
) -> Iterator[httpx.Client]:
    upstream = UpstreamSettings(httpserver.url_for(""), retry=FAST, read_timeout_s=read_timeout_s)
    config = ToolServerConfig(
        search=search,  # type: ignore[arg-type]
        reader="jina",
        serper=upstream,
        serpapi=upstream,
        jina=upstream,
        index_cache=False,
        **overrides,
    )
    metrics = ServiceMetrics("tool")
    search_provider, reader = build_providers(config, metrics)
    app = create_app(ToolExecutor(config, search_provider, reader, metrics), metrics)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield client


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERPER_API_KEY", SERPER_KEY)
    monkeypatch.setenv("SERPAPI_API_KEY", SERPAPI_KEY)
    monkeypatch.setenv("JINA_API_KEY", JINA_KEY)


def post(
    client: httpx.Client, session: str, name: str, arguments: dict[str, Any]
) -> dict[str, Any]:
    response = client.post(
        "/tool", json={"session_id": session, "name": name, "arguments": arguments}
    )
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_a_grpo_group_pays_for_each_distinct_query_once(httpserver: HTTPServer) -> None:
    lock = threading.Lock()
    queries: list[str] = []

    def serper(request: Request) -> Response:
        time.sleep(0.1)  # long enough for all eight to arrive while the first is in flight
        query = json.loads(request.data)["q"]
        with lock:
            queries.append(query)
        return Response(json.dumps(organic(query)), content_type="application/json")

    httpserver.expect_request("/search", method="POST").respond_with_handler(serper)
    with tool_server(httpserver) as client:

        def sample(k: int) -> list[str]:
            outputs = []
            for query in ("orrery Haldor", "Ilse Varen clockmaker", "Vorn valley"):
                outputs.append(post(client, f"sample-{k}", "search", {"query": query})["output"])
            return outputs

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(sample, range(8)))
        assert all(r == results[0] for r in results)
        assert sorted(queries) == sorted(["orrery Haldor", "Ilse Varen clockmaker", "Vorn valley"])
        # every sample kept its own results for click
        page = {
            "code": 200,
            "data": {"title": "Vorn", "url": "https://r1.example/Vorn-valley", "content": "text"},
        }
        httpserver.expect_request("/https://r1.example/Vorn-valley").respond_with_json(page)
        clicked = post(client, "sample-5", "click", {"link_id": 1})
        assert clicked["output"] == "Title: Vorn\nURL: https://r1.example/Vorn-valley\n\ntext"


def test_rate_limited_then_served(httpserver: HTTPServer) -> None:
    httpserver.expect_ordered_request("/search").respond_with_data(
        "", status=429, headers={"Retry-After": "0.2"}
    )
    httpserver.expect_ordered_request("/search").respond_with_json(organic("q"))
    with tool_server(httpserver) as client:
        body = post(client, "s", "search", {"query": "q"})
    assert "error" not in body and "【1】q 1" in body["output"]


def test_an_upstream_down_is_an_observation_not_a_crash(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/search").respond_with_data("down", status=503)
    with tool_server(httpserver) as client:
        body = post(client, "s", "search", {"query": "q"})
        assert body["error"]["code"] == "upstream_unavailable"
        assert "HTTP 503 after 3 attempts" in body["output"]
        assert client.get("/health").status_code == 200


@pytest.mark.slow
def test_a_slow_upstream_is_cut_at_the_call_deadline(httpserver: HTTPServer) -> None:
    """End to end on the real clock: an upstream that answers only after the test cannot cut
    the call; without the call's deadline the read timeout (30 s) would, so the bound is a
    third (it was 1.9 s against an upstream answering in 2 s)."""
    release = threading.Event()

    def held(_: Request) -> Response:
        release.wait(60)
        return Response(json.dumps(organic("q")), content_type="application/json")

    httpserver.expect_request("/search").respond_with_handler(held)
    try:
        with tool_server(httpserver, read_timeout_s=30, call_deadline_s=0.5) as client:
            started = time.monotonic()
            body = post(client, "s", "search", {"query": "q"})
            elapsed = time.monotonic() - started
    finally:
        release.set()
    assert body["error"]["code"] in {"deadline_exceeded", "upstream_unavailable"}
    assert elapsed < 10
    wait_for_requests(httpserver, 1)


def test_jina_pages_open_through_click(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/search").respond_with_json(organic("orrery"))

    def jina(request: Request) -> Response:
        assert request.headers["Authorization"] == f"Bearer {JINA_KEY}"
        url = request.full_path[1:].rstrip("?")
        content = {"code": 200, "data": {"title": "Page", "url": url, "content": "word " * 30}}
        return Response(json.dumps(content), content_type="application/json")

    httpserver.expect_request("/https://r2.example/orrery").respond_with_handler(jina)
    with tool_server(httpserver) as client:
        post(client, "s", "search", {"query": "orrery"})
        body = post(client, "s", "click", {"link_id": 2})
    assert body["output"].startswith("Title: Page\nURL: https://r2.example/orrery\n\nword word")


def test_auth_failure_turns_ready_off_and_is_reported_once(
    httpserver: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    httpserver.expect_request("/search").respond_with_json({"message": "Unauthorized."}, status=403)
    with caplog.at_level(logging.INFO), tool_server(httpserver) as client:
        assert client.get("/ready").status_code == 200
        for query in ("a", "b", "c"):
            body = post(client, "s", "search", {"query": query})
            assert body["error"]["code"] == "upstream_auth"
            assert "check SERPER_API_KEY" in body["output"]
        ready = client.get("/ready")
    assert ready.status_code == 503
    assert "search:serper" in ready.json()["reasons"]
    assert len(httpserver.log) == 3
    assert sum("upstream_auth_failed" in r.getMessage() for r in caplog.records) == 1


def test_keys_never_reach_logs_or_responses(
    httpserver: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    def echo_key(request: Request) -> Response:  # a hostile upstream that echoes the key back
        key = request.args.get("api_key", "")
        return Response(
            json.dumps(
                {"search_parameters": {"q": "q"}, "error": f"Invalid API key {key} for this plan"}
            ),
            content_type="application/json",
        )

    httpserver.expect_request("/search.json").respond_with_handler(echo_key)
    with caplog.at_level(logging.DEBUG), tool_server(httpserver, search="serpapi") as client:
        body = post(client, "s", "search", {"query": "q"})
        metrics = client.get("/metrics").text
    assert body["error"]["code"] == "upstream_bad_response"
    assert httpserver.log[0][0].args["api_key"] == SERPAPI_KEY  # the key did reach the upstream
    ours = [
        r.getMessage() for r in caplog.records if r.name != "werkzeug"
    ]  # werkzeug = the fake SerpAPI
    everything = json.dumps(body) + metrics + "\n".join(ours)
    for key in (SERPER_KEY, SERPAPI_KEY, JINA_KEY):
        assert key not in everything
    assert "***" in body["output"]


def test_a_search_snippet_that_echoes_the_key_never_shows_it(httpserver: HTTPServer) -> None:
    def echo(request: Request) -> Response:  # a snippet that quotes the request back
        key = request.headers["X-API-KEY"]
        item = {
            "title": "Request dump",
            "link": "https://r.example/",
            "snippet": f"X-API-KEY: {key}",
        }
        body = {"searchParameters": {"q": "q"}, "organic": [item]}
        return Response(json.dumps(body), content_type="application/json")

    httpserver.expect_request("/search").respond_with_handler(echo)
    with tool_server(httpserver) as client:
        response = client.post(
            "/tool", json={"session_id": "s", "name": "search", "arguments": {"query": "q"}}
        )
    assert httpserver.log[0][0].headers["X-API-KEY"] == SERPER_KEY
    assert "X-API-KEY: ***" in response.json()["output"]
    assert SERPER_KEY not in response.text


def test_a_page_that_echoes_the_key_never_shows_it(httpserver: HTTPServer) -> None:
    def echo(request: Request) -> Response:  # an echo service: the page is our own request
        text = f"GET / HTTP/1.1\nAuthorization: {request.headers['Authorization']}\n" + "word " * 20
        page = {
            "code": 200,
            "data": {"title": "Echo", "url": "https://echo.example/", "content": text},
        }
        return Response(json.dumps(page), content_type="application/json")

    httpserver.expect_request("/https://echo.example/").respond_with_handler(echo)
    with tool_server(httpserver) as client:
        response = client.post(
            "/tool",
            json={"session_id": "s", "name": "open", "arguments": {"url": "https://echo.example/"}},
        )
    assert "Authorization: Bearer ***" in response.json()["output"]
    assert JINA_KEY not in response.text


def test_a_url_encoded_key_echoed_back_is_redacted_everywhere(
    httpserver: HTTPServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from urllib.parse import quote

    special = "k3y/with+special=chars&x-tool"
    monkeypatch.setenv("SERPAPI_API_KEY", special)

    def echo(request: Request) -> Response:  # the query string as sent, and two re-encodings
        upper = quote(special, safe="")
        lower = re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(), upper)
        sent = request.query_string.decode()
        error = f"Invalid key in {sent} ({upper} / {lower})"
        body = {"search_parameters": {"q": "q"}, "error": error}
        return Response(json.dumps(body), content_type="application/json")

    httpserver.expect_request("/search.json").respond_with_handler(echo)
    with caplog.at_level(logging.DEBUG), tool_server(httpserver, search="serpapi") as client:
        response = client.post(
            "/tool", json={"session_id": "s", "name": "search", "arguments": {"query": "q"}}
        )
    assert httpserver.log[0][0].args["api_key"] == special  # the key did reach the upstream
    assert response.json()["error"]["code"] == "upstream_bad_response"
    ours = "\n".join(r.getMessage() for r in caplog.records if r.name != "werkzeug")
    for leaked in (response.text, ours):
        assert "with+special" not in leaked and "with%2B" not in leaked and "with%2b" not in leaked
    assert response.json()["output"].count("***") == 3


CLOUDFLARE_HTML = (
    "<!DOCTYPE html><html><head><title>Just a moment...</title></head><body>"
    "<div>Checking your browser before accessing r.jina.ai.</div></body></html>"
)


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        (CLOUDFLARE_HTML, "page_unavailable", "bot-protection challenge"),
        (
            "<html><body>Service temporarily moved</body></html>",
            "upstream_bad_response",
            "not valid JSON",
        ),
    ],
)
def test_a_reader_that_answers_html_with_200(
    httpserver: HTTPServer, body: str, code: str, fragment: str
) -> None:
    httpserver.expect_request("/https://guarded.example/").respond_with_data(
        body, status=200, content_type="text/html"
    )
    with tool_server(httpserver) as client:
        answer = post(client, "s", "open", {"url": "https://guarded.example/"})
    assert answer["error"]["code"] == code
    assert fragment in answer["output"] and answer["output"].startswith("jina: ")
