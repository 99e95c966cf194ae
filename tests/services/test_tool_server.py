"""The tool server for real: uvicorn on loopback, the offline providers on a small corpus."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp

from services.serving.metrics import ServiceMetrics
from services.tool_server.app import create_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.tools import ToolExecutor
from tests.helpers import DOCUMENTS, FORBIDDEN_QUESTION, serve_in_thread


def make_app(
    corpus_file: Path, tmp_path: Path, token: str | None = None, **overrides: Any
) -> ASGIApp:
    config = ToolServerConfig(
        corpus=corpus_file,
        index_cache_dir=tmp_path / "index",
        page_chars=500,
        blocked_domains=("blocked.example",),
        **overrides,
    )
    metrics = ServiceMetrics("tool")
    search, reader = build_providers(config, metrics)
    return create_app(ToolExecutor(config, search, reader, metrics), metrics, token=token)


@pytest.fixture
def client(corpus_file: Path, tmp_path: Path) -> Iterator[httpx.Client]:
    with serve_in_thread(make_app(corpus_file, tmp_path)) as base, httpx.Client(base_url=base) as c:
        yield c


def call(
    client: httpx.Client, name: str, arguments: Any, session: str = "s1", **extra: Any
) -> dict[str, Any]:
    response = client.post(
        "/tool", json={"session_id": session, "name": name, "arguments": arguments, **extra}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["output"] == body["observation"]
    return body


def test_search_then_click_a_string_link_id(client: httpx.Client) -> None:
    body = call(client, "search", {"query": "silver orrery Haldor", "num": 3})
    assert "error" not in body
    assert body["output"].startswith(
        "【1】Orrery of Haldor\nhttps://wiki.example/Orrery_of_Haldor\n"
    )
    assert "【3】" not in body["output"] or body["output"].count("【") <= 3
    clicked = call(client, "click", {"link_id": "1"})
    assert clicked["output"].startswith(
        "Title: Orrery of Haldor\nURL: https://wiki.example/Orrery_of_Haldor\n\n"
    )
    assert "Ilse Varen" in clicked["output"]


def test_click_needs_a_search_in_the_same_session(client: httpx.Client) -> None:
    call(client, "search", {"query": "orrery"}, session="a")
    body = call(client, "click", {"link_id": 1}, session="b")
    assert body["error"]["code"] == "invalid_link_id"
    body = call(client, "click", {"link_id": 99}, session="a")
    assert body["error"]["code"] == "invalid_link_id"
    assert "1 to" in body["output"]


def test_close_session_forgets_results(client: httpx.Client) -> None:
    call(client, "search", {"query": "orrery"})
    assert "Successfully closed" in call(client, "close_session", {})["output"]
    assert call(client, "click", {"link_id": 1})["error"]["code"] == "invalid_link_id"


def test_leakage_filter_drops_results_and_refuses_pages(client: httpx.Client) -> None:
    env: dict[str, Any] = {"remote_env_info": {"forbidden_texts": [FORBIDDEN_QUESTION]}}
    plain = call(
        client, "search", {"query": "clockmaker Vorn orrery museum Haldor quiz", "num": 10}
    )
    assert "quiz.example/leak" in plain["output"]
    filtered = call(
        client, "search", {"query": "clockmaker Vorn orrery museum Haldor quiz", "num": 10}, **env
    )
    assert "quiz.example/leak" not in filtered["output"]
    assert "wiki.example/Orrery_of_Haldor" in filtered["output"]
    refused = call(client, "open", {"url": "https://quiz.example/leak"}, **env)
    assert refused["error"]["code"] == "content_blocked"
    assert "Ilse Varen" not in refused["output"]


def test_blocked_domains_never_show_or_open(client: httpx.Client) -> None:
    body = call(client, "search", {"query": "valley of Vorn clockmakers", "num": 10})
    assert "blocked.example" not in body["output"]
    assert (
        call(client, "open", {"url": "https://sub.blocked.example/Vorn"})["error"]["code"]
        == "content_blocked"
    )


def test_long_pages_are_paginated_not_truncated(client: httpx.Client) -> None:
    first = call(client, "open", {"url": "https://wiki.example/Haldor"})
    assert "Page 1 of 7" in first["output"]
    assert 'call open with {"url":"https://wiki.example/Haldor","page":2}' in first["output"]
    pages = [first["output"]] + [
        call(client, "open", {"url": "https://wiki.example/Haldor", "page": n})["output"]
        for n in range(2, 8)
    ]
    bodies = [p.split("\n\n", 1)[1].rsplit("\n\n[Page ", 1)[0] for p in pages]
    expected = next(d["text"] for d in DOCUMENTS if d["url"] == "https://wiki.example/Haldor")
    assert " ".join(bodies).split() == expected.split()  # every word, once, in order
    past = call(client, "open", {"url": "https://wiki.example/Haldor", "page": 8})
    assert past["error"]["code"] == "invalid_arguments" and "7 page(s)" in past["output"]


@pytest.mark.parametrize(
    ("name", "arguments", "code"),
    [
        ("browse", {}, "unknown_tool"),
        ("search", {}, "invalid_arguments"),
        ("search", {"query": "   "}, "invalid_arguments"),
        ("search", {"query": "x", "num": "many"}, "invalid_arguments"),
        ("search", {"query": "x", "num": 0}, "invalid_arguments"),
        ("search", "orrery", "invalid_arguments"),
        ("click", {}, "invalid_arguments"),
        ("click", {"link_id": True}, "invalid_arguments"),
        ("open", {"url": 5}, "invalid_arguments"),
        ("open", {"url": "https://nowhere.example/x"}, "page_not_found"),
        ("open", {"url": "https://wiki.example/Haldor", "page": -1}, "invalid_arguments"),
    ],
)
def test_model_mistakes_are_observations_with_an_error_code(
    client: httpx.Client, name: str, arguments: Any, code: str
) -> None:
    body = call(client, name, arguments)
    assert body["error"]["code"] == code
    assert body["output"] == body["error"]["message"] != ""


@pytest.mark.parametrize(
    ("payload", "status", "fragment"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"", 400, "empty"),
        (b"[1, 2]", 422, "JSON object"),
        (b'{"name": "search"}', 422, "'session_id'"),
        (b'{"session_id": 7, "name": "search"}', 422, "got an integer"),
        (b'{"session_id": "s"}', 422, "'name'"),
        (b'{"session_id": "s", "name": "search", "remote_env_info": []}', 422, "'remote_env_info'"),
        (
            b'{"session_id": "s", "name": "search", "remote_env_info": {"forbidden_texts": "q"}}',
            422,
            "forbidden_texts",
        ),
    ],
)
def test_malformed_envelopes_are_4xx_naming_the_field(
    client: httpx.Client, payload: bytes, status: int, fragment: str
) -> None:
    response = client.post("/tool", content=payload)
    assert response.status_code == status
    assert fragment in response.json()["error"]["message"]


def test_oversized_bodies_are_refused_with_413(corpus_file: Path, tmp_path: Path) -> None:
    app = make_app(corpus_file, tmp_path, max_body_bytes=2_000)
    with serve_in_thread(app) as base:
        big = {"session_id": "s", "name": "search", "arguments": {"query": "x" * 5_000}}
        assert httpx.post(f"{base}/tool", json=big).status_code == 413

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
            yield b'{"session_id": "s", "name": "search", "arguments": {"query": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}}'

        assert httpx.post(f"{base}/tool", content=chunks()).status_code == 413


def test_probes_and_metrics(client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").json() == {
        "status": "ready",
        "search": "offline",
        "reader": "offline",
    }
    call(client, "search", {"query": "orrery"})
    call(client, "search", {"query": "  ORRERY "})  # same normalised query: a cache hit
    call(client, "open", {"url": "https://nowhere.example/"})
    text = client.get("/metrics").text
    assert 'deepdive_tool_requests_total{operation="search",outcome="ok"} 2.0' in text
    assert 'deepdive_tool_requests_total{operation="open",outcome="page_not_found"} 1.0' in text
    assert 'deepdive_tool_cache_hits_total{cache="search"} 1.0' in text
    assert 'deepdive_tool_request_latency_seconds_count{operation="search"} 2.0' in text


def test_the_root_path_accepts_deepdive_clients(client: httpx.Client) -> None:
    response = client.post(
        "/", json={"session_id": "s", "name": "search", "arguments": {"query": "orrery"}}
    )
    assert response.status_code == 200 and "Orrery" in response.json()["output"]


def test_bearer_token_guards_everything_but_health(corpus_file: Path, tmp_path: Path) -> None:
    app = make_app(corpus_file, tmp_path, token="s3cret-token-value")
    payload = {"session_id": "s", "name": "search", "arguments": {"query": "orrery"}}
    with serve_in_thread(app) as base:
        assert httpx.get(f"{base}/health").status_code == 200
        assert httpx.get(f"{base}/ready").status_code == 401
        assert httpx.post(f"{base}/tool", json=payload).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.post(f"{base}/tool", json=payload, headers=wrong).status_code == 401
        right = {"Authorization": "Bearer s3cret-token-value"}
        response = httpx.post(f"{base}/tool", json=payload, headers=right)
        assert response.status_code == 200 and "s3cret" not in response.text


@pytest.mark.parametrize(
    ("header", "status"),
    [
        ("bearer s3cret-token-value", 200),
        ("BEARER s3cret-token-value", 200),
        ("Bearer   s3cret-token-value", 200),
        ("bearer S3CRET-TOKEN-VALUE", 401),  # the scheme is case-insensitive, the token is not
        ("Basic s3cret-token-value", 401),
        ("Bearer", 401),
        ("s3cret-token-value", 401),
    ],
)
def test_the_auth_scheme_is_case_insensitive_and_the_token_exact(
    corpus_file: Path, tmp_path: Path, header: str, status: int
) -> None:
    app = make_app(corpus_file, tmp_path, token="s3cret-token-value")
    with serve_in_thread(app) as base:
        response = httpx.get(f"{base}/ready", headers={"Authorization": header})
    assert response.status_code == status


def test_a_client_that_disconnects_mid_body_is_no_error_of_ours(
    client: httpx.Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    host, port = str(client.base_url.host), int(client.base_url.port or 80)
    with socket.create_connection((host, port)) as sock:  # closed with 990 bytes still to come
        sock.sendall(
            b"POST /tool HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"session_'
        )
    outcome = 'deepdive_tool_requests_total{operation="invalid",outcome="client_disconnected"} 1.0'
    deadline = time.monotonic() + 5
    metrics = ""
    while outcome not in metrics and time.monotonic() < deadline:
        time.sleep(0.02)
        metrics = client.get("/metrics").text
    assert outcome in metrics
    assert "internal_error" not in metrics
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if "internal_error" in r.getMessage()]


def test_model_chosen_strings_are_bounded_at_the_door(corpus_file: Path, tmp_path: Path) -> None:
    # A 500 KB query once became a cache key held for an hour.
    app = make_app(corpus_file, tmp_path, max_query_chars=50, max_url_chars=60)
    with serve_in_thread(app) as base, httpx.Client(base_url=base) as c:
        query = call(c, "search", {"query": "orrery " * 10})
        assert query["error"]["code"] == "invalid_arguments"
        assert "query is 69 characters long; at most 50" in query["observation"]
        url = call(c, "open", {"url": "https://wiki.example/" + "x" * 50})
        assert "url is 71 characters long; at most 60" in url["observation"]
        assert "error" not in call(c, "search", {"query": "orrery " * 7})


def test_a_page_past_max_page_chars_is_cut_and_says_so(corpus_file: Path, tmp_path: Path) -> None:
    # The Haldor page has ~3,400 characters; cut at 1,000, it is three pages of at most 500.
    app = make_app(corpus_file, tmp_path, max_page_chars=1_000)
    with serve_in_thread(app) as base, httpx.Client(base_url=base) as c:
        first = call(c, "open", {"url": "https://wiki.example/Haldor"})["observation"]
        assert "Page 1 of 3" in first and "not shown" not in first
        last = call(c, "open", {"url": "https://wiki.example/Haldor", "page": 3})["observation"]
        assert last.endswith("[The page is longer than 1,000 characters; the rest is not shown.]")
        again = call(c, "open", {"url": "https://wiki.example/Haldor", "page": 3})["observation"]
        assert again == last  # served from the prepared page in the cache
