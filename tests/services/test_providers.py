"""Serper, SerpAPI, Jina and the direct reader, each against a fake upstream in its real format."""

import time

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from services.base.errors import (
    PageUnavailable,
    UpstreamAuthError,
    UpstreamBadResponse,
    UpstreamRateLimited,
    URLRejected,
)
from services.client.http import UpstreamSettings
from services.client.retries import RetryPolicy
from services.tool_server.direct import DirectReader
from services.tool_server.jina import JinaReader
from services.tool_server.serpapi import SerpApiSearch
from services.tool_server.serper import SerperSearch
from services.tool_server.urlguard import URLGuard
from tests.helpers import Closing

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.02)
SERPER_BODY = {
    "searchParameters": {"q": "orrery", "type": "search"},
    "answerBox": {"snippet": "An orrery is a model"},
    "organic": [
        {
            "title": "Orrery - Wikipedia",
            "link": "https://en.wikipedia.org/wiki/Orrery",
            "snippet": "An  orrery\nis a mechanical model.",
            "position": 1,
        },
        {"title": "No link", "snippet": "skipped", "position": 2},
        {"title": "Haldor", "link": "https://haldor.example/", "snippet": "City", "position": 3},
    ],
    "peopleAlsoAsk": [],
}
CLOUDFLARE = "<html><head><title>Just a moment...</title></head><body>Checking your browser before accessing example.com</body></html>"


def settings(httpserver: HTTPServer) -> UpstreamSettings:
    return UpstreamSettings(httpserver.url_for(""), retry=FAST, read_timeout_s=5)


def deadline() -> float:
    return time.monotonic() + 10


@pytest.mark.anyio
async def test_serper_sends_key_in_header_and_parses_organic(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request(
        "/search",
        method="POST",
        headers={"X-API-KEY": "serper-secret-123"},
        json={"q": "orrery", "num": 5, "gl": "us"},
    ).respond_with_json(SERPER_BODY)
    search = closing(SerperSearch(settings(httpserver), "serper-secret-123", gl="us"))
    results = await search.search("orrery", 5, deadline())
    assert [(r.title, r.url, r.snippet) for r in results] == [
        (
            "Orrery - Wikipedia",
            "https://en.wikipedia.org/wiki/Orrery",
            "An orrery is a mechanical model.",
        ),
        ("Haldor", "https://haldor.example/", "City"),
    ]


@pytest.mark.anyio
async def test_serper_malformed_json_is_a_bad_response(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/search").respond_with_data(
        '{"organic": [', content_type="application/json"
    )
    search = closing(SerperSearch(settings(httpserver), "k" * 10))
    with pytest.raises(UpstreamBadResponse, match="not valid JSON"):
        await search.search("q", 5, deadline())


@pytest.mark.anyio
async def test_serper_without_key_is_not_ready(httpserver: HTTPServer, closing: Closing) -> None:
    search = closing(SerperSearch(settings(httpserver), None))
    assert search.not_ready_reason() == "SERPER_API_KEY is not set"


@pytest.mark.anyio
async def test_serpapi_parses_organic_results(httpserver: HTTPServer, closing: Closing) -> None:
    httpserver.expect_request(
        "/search.json",
        query_string={
            "engine": "google",
            "q": "orrery",
            "num": "3",
            "start": "0",
            "api_key": "serpapi-secret-456",
        },
    ).respond_with_json(
        {
            "search_metadata": {"status": "Success"},
            "search_parameters": {"engine": "google", "q": "orrery"},
            "organic_results": [
                {
                    "position": 1,
                    "title": "Orrery",
                    "link": "https://o.example/",
                    "snippet": "model",
                },
            ],
        }
    )
    search = closing(SerpApiSearch(settings(httpserver), "serpapi-secret-456"))
    results = await search.search("orrery", 3, deadline())
    assert [(r.title, r.url) for r in results] == [("Orrery", "https://o.example/")]


@pytest.mark.anyio
async def test_serpapi_no_results_error_on_200_is_an_empty_list(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/search.json").respond_with_json(
        {
            "search_metadata": {"status": "Success"},
            "search_parameters": {"engine": "google", "q": "zzzz"},
            "error": "Google hasn't returned any results for this query.",
        }
    )
    search = closing(SerpApiSearch(settings(httpserver), "serpapi-secret-456"))
    assert await search.search("zzzz", 3, deadline()) == []


@pytest.mark.anyio
async def test_serpapi_other_error_on_200_is_a_bad_response(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/search.json").respond_with_json(
        {"search_parameters": {"q": "q"}, "error": "Unsupported `xx` location."}
    )
    search = closing(SerpApiSearch(settings(httpserver), "serpapi-secret-456"))
    with pytest.raises(UpstreamBadResponse, match="Unsupported"):
        await search.search("q", 3, deadline())


@pytest.mark.anyio
async def test_serpapi_out_of_credit_429_is_an_auth_error_without_retry(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/search.json").respond_with_json(
        {"error": "Your account has run out of searches."}, status=429
    )
    search = closing(SerpApiSearch(settings(httpserver), "serpapi-secret-456"))
    with pytest.raises(UpstreamAuthError, match="run out of searches"):
        await search.search("q", 3, deadline())
    assert len(httpserver.log) == 1
    assert search.not_ready_reason() is not None


@pytest.mark.anyio
async def test_serpapi_plain_rate_limit_is_retried(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/search.json").respond_with_json({"error": "rate"}, status=429)
    search = closing(SerpApiSearch(settings(httpserver), "serpapi-secret-456"))
    with pytest.raises(UpstreamRateLimited):
        await search.search("q", 3, deadline())
    assert len(httpserver.log) == 3


def jina_handler(body: dict[str, object], status: int = 200):  # type: ignore[no-untyped-def]
    def handler(request: Request) -> Response:
        assert request.headers["Authorization"] == "Bearer jina-secret-789"
        assert request.headers["Accept"] == "application/json"
        assert request.full_path.startswith("/https://site.example/page")
        import json

        return Response(json.dumps(body), status=status, content_type="application/json")

    return handler


@pytest.mark.anyio
async def test_jina_reads_a_page(httpserver: HTTPServer, closing: Closing) -> None:
    httpserver.expect_request("/https://site.example/page").respond_with_handler(
        jina_handler(
            {
                "code": 200,
                "status": 20000,
                "data": {
                    "title": "Site",
                    "url": "https://site.example/page",
                    "content": "Hello page",
                },
            }
        )
    )
    reader = closing(JinaReader(settings(httpserver), "jina-secret-789", URLGuard()))
    page = await reader.read("https://site.example/page", deadline())
    assert (page.title, page.url, page.text) == ("Site", "https://site.example/page", "Hello page")


@pytest.mark.anyio
async def test_jina_cloudflare_challenge_on_200_is_unavailable(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/https://site.example/page").respond_with_handler(
        jina_handler(
            {
                "code": 200,
                "data": {
                    "title": "Just a moment...",
                    "url": "https://site.example/page",
                    "content": CLOUDFLARE,
                },
            }
        )
    )
    reader = closing(JinaReader(settings(httpserver), "jina-secret-789", URLGuard()))
    with pytest.raises(PageUnavailable, match="bot-protection challenge"):
        await reader.read("https://site.example/page", deadline())


@pytest.mark.anyio
async def test_jina_without_content_is_a_bad_response(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/https://site.example/page").respond_with_handler(
        jina_handler({"code": 200, "data": None})
    )
    reader = closing(JinaReader(settings(httpserver), "jina-secret-789", URLGuard()))
    with pytest.raises(UpstreamBadResponse, match=r"no data\.content"):
        await reader.read("https://site.example/page", deadline())


@pytest.mark.anyio
async def test_jina_402_means_out_of_credit(httpserver: HTTPServer, closing: Closing) -> None:
    httpserver.expect_request("/https://site.example/page").respond_with_handler(
        jina_handler({"code": 402}, status=402)
    )
    reader = closing(JinaReader(settings(httpserver), "jina-secret-789", URLGuard()))
    with pytest.raises(UpstreamAuthError, match="out of credit; check JINA_API_KEY"):
        await reader.read("https://site.example/page", deadline())


@pytest.mark.anyio
async def test_jina_refuses_internal_urls_before_asking(
    httpserver: HTTPServer, closing: Closing
) -> None:
    reader = closing(JinaReader(settings(httpserver), "jina-secret-789", URLGuard()))
    with pytest.raises(URLRejected):
        await reader.read("http://169.254.169.254/latest/", deadline())
    assert len(httpserver.log) == 0


HTML = """<html><head><title> The  Page </title><style>p{}</style><script>var x=1</script></head>
<body><nav>Home | About</nav><h1>Heading</h1><p>First <b>bold</b> paragraph.</p>
<div>Second&nbsp;block</div><footer>copyright</footer></body></html>"""


def direct_reader() -> DirectReader:
    # Loopback is trusted explicitly here: the fake site lives on 127.0.0.1.
    return DirectReader(UpstreamSettings("", retry=FAST), URLGuard(["127.0.0.0/8"]))


@pytest.mark.anyio
async def test_direct_reader_extracts_readable_text(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/article").respond_with_data(
        HTML, content_type="text/html; charset=utf-8"
    )
    reader = closing(direct_reader())
    page = await reader.read(httpserver.url_for("/article"), deadline())
    assert page.title == "The Page"
    assert page.text == "Heading\nFirst bold paragraph.\nSecond block"
    request = httpserver.log[0][0]
    assert request.headers["Host"] == f"{httpserver.host}:{httpserver.port}"


@pytest.mark.anyio
async def test_direct_reader_follows_redirects_and_checks_each_hop(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/start").respond_with_data(
        "", status=302, headers={"Location": "/article"}
    )
    httpserver.expect_request("/article").respond_with_data(HTML, content_type="text/html")
    httpserver.expect_request("/evil").respond_with_data(
        "", status=302, headers={"Location": "http://169.254.169.254/latest/meta-data/"}
    )
    reader = closing(direct_reader())
    page = await reader.read(httpserver.url_for("/start"), deadline())
    assert page.url.endswith("/article") and "Heading" in page.text
    with pytest.raises(URLRejected, match="private or reserved"):
        await reader.read(httpserver.url_for("/evil"), deadline())


@pytest.mark.anyio
@pytest.mark.parametrize(
    "location", ["http://0177.0.0.1/", "http://0251.0376.0251.0376/", "http://xn--/"]
)
async def test_a_redirect_to_a_malformed_address_is_rejected(
    httpserver: HTTPServer, location: str, closing: Closing
) -> None:
    # Joining such a Location raised httpx.InvalidURL outside the guard: once an HTTP 500.
    httpserver.expect_request("/hop").respond_with_data(
        "", status=302, headers={"Location": location}
    )
    reader = closing(direct_reader())
    with pytest.raises(URLRejected):
        await reader.read(httpserver.url_for("/hop"), deadline())


@pytest.mark.anyio
async def test_direct_reader_refuses_loopback_by_default(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/article").respond_with_data(HTML, content_type="text/html")
    reader = closing(DirectReader(UpstreamSettings("", retry=FAST), URLGuard()))
    with pytest.raises(URLRejected):
        await reader.read(httpserver.url_for("/article"), deadline())
    assert len(httpserver.log) == 0


@pytest.mark.anyio
async def test_direct_reader_refuses_challenges_and_binary(
    httpserver: HTTPServer, closing: Closing
) -> None:
    httpserver.expect_request("/cf").respond_with_data(CLOUDFLARE, content_type="text/html")
    httpserver.expect_request("/pdf").respond_with_data(b"%PDF-1.4", content_type="application/pdf")
    httpserver.expect_request("/txt").respond_with_data("plain words", content_type="text/plain")
    reader = closing(direct_reader())
    with pytest.raises(PageUnavailable, match="challenge"):
        await reader.read(httpserver.url_for("/cf"), deadline())
    with pytest.raises(PageUnavailable, match="application/pdf"):
        await reader.read(httpserver.url_for("/pdf"), deadline())
    assert (await reader.read(httpserver.url_for("/txt"), deadline())).text == "plain words"


@pytest.mark.anyio
async def test_a_sites_401_or_403_is_that_pages_answer_not_a_key_problem(
    httpserver: HTTPServer, closing: Closing
) -> None:
    # The direct reader has no key: a site's 403 (often a bot challenge) once marked the reader
    # as failed authentication, turning /ready off for every page.
    httpserver.expect_request("/cf").respond_with_data(
        CLOUDFLARE, status=403, content_type="text/html"
    )
    httpserver.expect_request("/private").respond_with_data("no", status=401)
    reader = closing(direct_reader())
    with pytest.raises(PageUnavailable, match="challenge"):
        await reader.read(httpserver.url_for("/cf"), deadline())
    with pytest.raises(PageUnavailable, match="HTTP 401"):
        await reader.read(httpserver.url_for("/private"), deadline())
    assert reader.not_ready_reason() is None
    assert len(httpserver.log) == 2  # a refusal is not retried
