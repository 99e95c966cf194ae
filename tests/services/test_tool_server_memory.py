"""Memory of a real tool server process fed model-sized abuse: 1,000 maximal queries and 1,000
maximal pages (from a fake Jina reader) stay inside the bound the caches state.

The bound: the server's resident memory grows by at most search-cache + page-cache budget + a
fixed allowance for the allocator and the sessions (STATED_ALLOWANCE_MB). Measured: +64-72 MB
(2026-12-02, under the service's GC settings, services/serving/heap.py; before the lean client freed a
closed connection at once it was +95 MB with CPython's and +310 MB with those); the same load
with 4,000 MiB budgets and no cut grew the server by 392 MB.
"""

from __future__ import annotations

import concurrent.futures
import random
import re
from pathlib import Path

import httpx
import orjson
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from services.base.process import ServiceProcess

QUERIES = 1_000
PAGES = 1_000
MAX_QUERY_CHARS = 1_000
MAX_PAGE_CHARS = 100_000
SEARCH_CACHE_MB = 16
PAGE_CACHE_MB = 32
STATED_ALLOWANCE_MB = 64  # allocator slack, sessions, metrics, one page in flight per worker


def words(seed: int, chars: int) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:chars]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.slow
def test_memory_stays_inside_the_cache_budgets(
    httpserver: HTTPServer, corpus_file: Path, tmp_path: Path
) -> None:
    text = words(0, MAX_PAGE_CHARS * 2)  # twice the cut; each reply is decoded anew

    def page(request: Request) -> Response:
        url = request.path.lstrip("/")
        content = f"{url} {text}"
        body = {"code": 200, "data": {"title": url[-20:], "url": url, "content": content}}
        return Response(orjson.dumps(body), content_type="application/json")

    httpserver.expect_request(re.compile("^/.*")).respond_with_handler(page)
    arguments = [
        "tools",
        "--search=offline",
        "--reader=jina",
        f"--jina.base-url={httpserver.url_for('')}",
        f"--corpus={corpus_file}",
        "--index-cache",
        "false",
        f"--max-query-chars={MAX_QUERY_CHARS}",
        f"--max-page-chars={MAX_PAGE_CHARS}",
        f"--search-cache.max-bytes={SEARCH_CACHE_MB * 2**20}",
        f"--page-cache.max-bytes={PAGE_CACHE_MB * 2**20}",
        "--log-level=WARNING",
        "--workers=1",  # the bound is per worker process: one, measured by its pid
    ]
    with ServiceProcess("tool", arguments, tmp_path / "tool.log") as server:
        assert server.process is not None
        pid = server.process.pid
        with httpx.Client(base_url=server.url, timeout=60) as client:

            def call(index: int, name: str, arguments: dict[str, object]) -> dict[str, object]:
                body = {"session_id": f"s{index % 50}", "name": name, "arguments": arguments}
                response = client.post("/tool", json=body)
                assert response.status_code == 200, response.text
                reply: dict[str, object] = response.json()
                return reply

            warm = call(0, "open", {"url": "https://warm.example/0"})
            assert "error" not in warm
            before = rss_mb(pid)
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                searches = pool.map(
                    lambda i: call(i, "search", {"query": words(i, MAX_QUERY_CHARS)}),
                    range(QUERIES),
                )
                assert all("error" not in reply for reply in searches)
                opened = list(
                    pool.map(
                        lambda i: call(
                            i, "open", {"url": f"https://site{i}.example/p", "page": 10}
                        ),
                        range(PAGES),
                    )
                )
            assert all("error" not in reply for reply in opened)
            pages = int(re.findall(r"Page 10 of (\d+)", str(opened[-1]["observation"]))[0])
            last = call(0, "open", {"url": f"https://site{PAGES - 1}.example/p", "page": pages})
            assert "the rest is not shown" in str(last["observation"])  # cut at MAX_PAGE_CHARS
            too_long = call(0, "search", {"query": "x" * (MAX_QUERY_CHARS + 1)})
            assert "at most 1000" in str(too_long["observation"])
            grown = rss_mb(pid) - before
    bound = SEARCH_CACHE_MB + PAGE_CACHE_MB + STATED_ALLOWANCE_MB
    assert grown <= bound, f"the server grew by {grown:.0f} MB; the bound is {bound} MB"
