"""Upstreams that break HTTP framing (fakes/hostile_upstream.py) against every client the project
uses: the lean client of the rollout's cluster hops (`plain_http=True`) and aiohttp for what
leaves the cluster, directly and through the tool server's search and open (POST /tool, its
caches on) and the reward server's judge (POST /evaluate, its verdict cache on). Each caller must get its own reply or a clean error, never another caller's: a reply
longer than its length or an unasked reply closes the connection, interim 1xx replies are
skipped, and a head without end is refused long before the deadline."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepdive.protocol import FINISH, format_observation, format_tool_call
from fakes.hostile_upstream import HostileUpstream, Misbehaviour, hostile_upstream
from services.base.errors import ConfigError, UpstreamBadResponse, UpstreamError
from services.cache import CacheSettings
from services.client.http import Upstream, UpstreamSettings
from services.client.plain_http import MAX_HEAD_BYTES, check_header
from services.client.retries import RetryPolicy
from services.reward_server.app import create_app as create_reward_app
from services.reward_server.build import build_judge
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.reward_server.judging import Verdict
from services.reward_server.openai_judge import OpenAIJudge
from services.serving.metrics import ServiceMetrics
from services.tool_server.app import create_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.serper import SerperSearch
from services.tool_server.tools import ToolExecutor
from tests.helpers import serve_in_thread

ONCE = RetryPolicy(max_attempts=1)
PATIENT = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)
INJECTED = b'{"owner": "FAKE-INJECTED"}'
FRAMING: list[Misbehaviour] = ["overlong", "interim_100", "interim_103"]
CLIENTS = {"lean": True, "aiohttp": False}
SESSIONS, CALLS = 16, 12  # 192 calls, as the probe that found the desync made


def echo(path: str, body: bytes) -> bytes:
    return orjson.dumps({"owner": orjson.loads(body)["owner"], "path": path})


def client(base: str, lean: bool, **settings: Any) -> Upstream:
    options: dict[str, Any] = {"plain_http": lean, "retry": ONCE, "read_timeout_s": 30.0}
    options.update(settings)
    return Upstream("svc", UpstreamSettings(base, **options))


@pytest.mark.anyio
@pytest.mark.parametrize("behaviour", FRAMING)
@pytest.mark.parametrize("kind", CLIENTS)
async def test_every_caller_gets_its_own_reply(kind: str, behaviour: Misbehaviour) -> None:
    with hostile_upstream(echo, behaviour, INJECTED) as upstream:
        up = client(upstream.url, CLIENTS[kind], max_concurrency=4)  # sessions share connections

        async def session(number: int) -> list[tuple[str, bytes]]:
            seen = []
            for call in range(CALLS):
                owner = f"s{number}-c{call}"
                try:
                    reply = await up.send("POST", "/search", json={"owner": owner})
                except UpstreamError as exc:  # a clean failure is allowed, a wrong reply is not
                    seen.append((owner, exc.message.encode()))
                else:
                    assert reply.status_code == 200, (owner, reply.status_code)
                    seen.append((owner, reply.content))
            return seen

        try:
            results = await asyncio.gather(*(session(n) for n in range(SESSIONS)))
        finally:
            await up.aclose()
    answers = [pair for seen in results for pair in seen]
    assert len(answers) == SESSIONS * CALLS
    for owner, content in answers:
        assert b"FAKE-INJECTED" not in content
        if content.startswith(b"{"):
            assert orjson.loads(content)["owner"] == owner
    delivered = sum(content.startswith(b"{") for _, content in answers)
    assert delivered == len(answers), "honest replies within their length must all arrive"


@pytest.mark.anyio
@pytest.mark.parametrize("kind", CLIENTS)
async def test_bytes_that_arrive_on_an_idle_connection_close_it(kind: str) -> None:
    """A reply longer than its length whose extra bytes come in a later segment, while the
    connection idles in the pool: the next request must go out on a fresh connection. aiohttp
    3.14.5 alone hands such bytes to the next request (aio-libs/aiohttp#13656, its connector's
    _get reuses a connection without checking should_close); services/client/http.py's
    ReuseCheckedConnector closes the connection instead."""
    with hostile_upstream(echo, "overlong_late", INJECTED) as upstream:
        up = client(upstream.url, CLIENTS[kind])
        try:
            for call in range(6):
                reply = await up.send("POST", "/search", json={"owner": f"c{call}"})
                assert orjson.loads(reply.content)["owner"] == f"c{call}"
                await asyncio.to_thread(upstream.wait_for_late_writes, call + 1)
                await asyncio.sleep(0.01)  # the client's loop reads what arrived
        finally:
            await up.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("behaviour", ["endless_line", "endless_fields"])
@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_head_without_end_is_refused_not_read_until_the_deadline(
    kind: str, behaviour: Misbehaviour
) -> None:
    """The deadline (30 s) is the failure mode; the refusal must come from the head's size,
    after at most a few times the largest head either client accepts."""
    with hostile_upstream(echo, behaviour) as upstream:
        up = client(upstream.url, CLIENTS[kind])
        try:
            with pytest.raises(UpstreamError) as refused:
                await up.send("POST", "/search", json={"owner": "a"})
        finally:
            await up.aclose()
        written = upstream.endless_bytes
    assert "timed out" not in refused.value.message
    # What the upstream wrote before the client hung up: on a loaded machine the writer runs
    # on while the refusal waits for a CPU (4.3 MB was seen); a client that read on until the
    # deadline would take gigabytes, so 64 MB is still far under a third of the failure mode.
    assert written < 1024 * MAX_HEAD_BYTES, written


@pytest.mark.slow  # an end-to-end wall-clock bound (docs/testing.md, "The `slow` marker")
@pytest.mark.anyio
@pytest.mark.parametrize("kind", CLIENTS)
async def test_a_trickled_reply_is_cut_at_the_read_timeout_when_the_deadline_is_further(
    kind: str,
) -> None:
    """A tool call's deadline (60 s) is further than the read timeout (here 1 s): the attempt
    is still bounded as a whole by the read timeout, not per read (a byte every 0.1 s would
    never trip a per-read timer). The failure mode is the trickle's 30 s; the bound a third."""
    with hostile_upstream(echo, "trickle") as upstream:
        up = client(upstream.url, CLIENTS[kind], read_timeout_s=1.0)
        try:
            started = time.monotonic()
            with pytest.raises(UpstreamError, match="timed out"):
                await up.send("POST", "/search", json={"owner": "a"}, deadline=started + 60)
            assert time.monotonic() - started < 10
        finally:
            await up.aclose()


def test_a_header_that_would_split_the_request_is_refused_naming_it_not_its_value() -> None:
    for value in ("a\r\nX-Evil: 1", "a\nb", "a\rb", "a\x00b"):
        with pytest.raises(ValueError, match="'X-Key' has a CR, LF or NUL") as refused:
            check_header("X-Key", value)
        assert value not in str(refused.value)
    for name in ("X Key", "X:Key", "X-Kéy", "", "X\r\nEvil"):
        with pytest.raises(ValueError, match="is not an HTTP token"):
            check_header(name, "v")
    check_header("Authorization", "Bearer t0k3n-._~+/=")
    for lean in CLIENTS.values():
        with pytest.raises(ConfigError, match="svc: header 'Authorization'"):
            Upstream(
                "svc",
                UpstreamSettings("http://127.0.0.1:1", plain_http=lean),
                headers={"Authorization": "Bearer secret\r\nX-Evil: 1"},
            )


_DELIMITERS = set('"(),/:;<=>?@[\\]{}')


def _is_token(name: str) -> bool:
    """RFC 9110 5.6.2, character by character: visible ASCII other than the delimiters."""
    return bool(name) and all(33 <= ord(c) <= 126 and c not in _DELIMITERS for c in name)


@given(st.text(max_size=12), st.text(max_size=12))
def test_check_header_refuses_exactly_what_rfc_9110_forbids(name: str, value: str) -> None:
    """Any Unicode name and value: refused iff the name is not a token, or the value has a CR,
    LF or NUL or a character outside Latin-1 (the regular expressions against the RFC's words)."""
    allowed = (
        _is_token(name)
        and not any(c in value for c in "\r\n\0")
        and all(ord(c) < 256 for c in value)
    )
    try:
        check_header(name, value)
    except ValueError:
        assert not allowed
    else:
        assert allowed


# Through the services: Serper behind the tool server, an OpenAI-compatible judge behind the
# reward server's evaluator (both always aiohttp, whatever their URL's scheme).


def searched(path: str, body: bytes) -> bytes:
    """Serper's reply: its results, and the query it answers (searchParameters.q)."""
    query = orjson.loads(body)["q"]
    results = [{"title": f"{query} {i}", "link": f"https://r{i}.example/{query}"} for i in range(3)]
    return orjson.dumps({"searchParameters": {"q": query}, "organic": results})


INJECTED_RESULTS = orjson.dumps(
    {"organic": [{"title": "FAKE-INJECTED", "link": "https://fake-injected.example/"}]}
)


@pytest.fixture
def serper_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SERPER_API_KEY", "serper-key-0123456789")
    yield


@pytest.mark.usefixtures("serper_key")
@pytest.mark.parametrize("behaviour", FRAMING)
def test_the_tool_server_gives_each_session_its_own_results(behaviour: Misbehaviour) -> None:
    with hostile_upstream(searched, behaviour, INJECTED_RESULTS) as upstream:
        settings = UpstreamSettings(upstream.url, retry=ONCE, max_concurrency=4)
        config = ToolServerConfig(search="serper", serper=settings, index_cache=False)
        metrics = ServiceMetrics("tool")
        search, reader = build_providers(config, metrics)
        app = create_app(ToolExecutor(config, search, reader, metrics), metrics)

        def session(number: int) -> list[tuple[str, str]]:
            seen = []
            with httpx.Client(base_url=base, timeout=60) as http:
                for call in range(CALLS):
                    query = f"q{number}x{call}"
                    body = {"session_id": f"s{number}", "name": "search"}
                    body["arguments"] = {"query": query}  # type: ignore[assignment]
                    reply = http.post("/tool", json=body).json()
                    seen.append((query, reply.get("observation") or str(reply.get("error"))))
            return seen

        with serve_in_thread(app) as base, ThreadPoolExecutor(SESSIONS) as pool:
            results = list(pool.map(session, range(SESSIONS)))
    for query, observation in (pair for seen in results for pair in seen):
        assert "FAKE-INJECTED" not in observation
        assert query in observation, (query, observation[:200])


QUESTION = "What is the capital of France?"


def grades(path: str, body: bytes) -> bytes:
    prompt = orjson.loads(body)["messages"][-1]["content"]
    answer = re.search(r"\[response\]: (.*)\n", prompt)
    verdict = "yes" if answer and answer.group(1) == "Paris" else "no"
    content = f"extracted_final_answer: x\n\nreasoning: fake\n\ncorrect: {verdict}"
    return orjson.dumps({"choices": [{"index": 0, "message": {"content": content}}]})


ALWAYS_RIGHT = orjson.dumps(
    {"choices": [{"index": 0, "message": {"content": "extracted_final_answer: x\n\ncorrect: yes"}}]}
)


@pytest.mark.anyio
@pytest.mark.parametrize("behaviour", FRAMING)
async def test_the_judge_gives_each_answer_its_own_verdict(behaviour: Misbehaviour) -> None:
    with hostile_upstream(grades, behaviour, ALWAYS_RIGHT) as upstream:
        settings = UpstreamSettings(upstream.url + "/v1", retry=ONCE, max_concurrency=4)
        judge = OpenAIJudge(settings, "judge-key", model="m", metrics=ServiceMetrics("reward"))

        async def grade(number: int) -> tuple[bool, bool | None]:
            right = number % 2 == 0
            answer = "Paris" if right else f"Lyon {number}"  # distinct: no verdict cached
            deadline = time.monotonic() + 60
            verdict = await judge.judge(QUESTION, ("Paris",), answer, deadline)
            return right, verdict.correct

        try:
            verdicts = await asyncio.gather(*(grade(n) for n in range(SESSIONS * CALLS)))
        finally:
            await judge.aclose()
    wrongly_rewarded = [n for n, (right, correct) in enumerate(verdicts) if correct and not right]
    assert wrongly_rewarded == []
    # the right answers are one cached verdict: it must be the right one
    assert all(correct for right, correct in verdicts if right)


# Replies nobody asked for, shortly after each answer, on a connection the client keeps: under
# load (16 sessions x 12 calls on 4 pooled connections) the connection is often carrying its
# next request by then, where no HTTP/1.1 client can tell the unasked reply from the answer.
# The defences: the idle check on reuse, a search reply that must repeat its query, and a
# connection per request for the judge and the page readers.
UNASKED: list[Misbehaviour] = ["unasked_late", "head_late"]
# How long after each answer the unasked reply comes: 0.02 s lands it mostly on a connection
# already carrying its next request (no HTTP/1.1 client can tell it from the answer there:
# what refuses it is the reply's own contract); the probe's 0.3 s mostly on one idle in the
# pool between calls (the reuse check's case).
EARLY_S, LATE_S = 0.02, 0.3


def think_s(late_s: float) -> float:
    """How long each session pauses between its calls: for the late (0.3 s) reply, a little
    longer than its delay, so that it lands while the connection idles in the pool (under
    back-to-back calls the 4 connections are never idle); for the early one, no pause."""
    return late_s + 0.05 if late_s == LATE_S else 0.0


def unasked_cases(slow_early_head: bool = False) -> list[Any]:
    """(behaviour, late_s) for each unasked reply and delay. The 0.3 s cases take 4-6 s each
    (12 calls, each after a pause: think_s), so they are `slow`; through a pooled connection
    (search, `slow_early_head`) so is the 0.02 s head: one that lands on a request in flight is
    read as its reply and holds the call for the read timeout (5 s) before the retry, 12-18 s
    in all."""
    return [
        pytest.param(
            behaviour,
            late_s,
            id=f"{behaviour}-{late_s}",
            marks=[pytest.mark.slow]
            if late_s == LATE_S or (slow_early_head and behaviour == "head_late")
            else [],
        )
        for behaviour in UNASKED
        for late_s in (EARLY_S, LATE_S)
    ]


def read_page(path: str, body: bytes) -> bytes:
    """Jina's reply for the page at `path` (/https://...): its text names the page."""
    url = path.removeprefix("/")
    content = f"the page {url} " * 5
    return orjson.dumps({"code": 200, "data": {"title": "t", "url": url, "content": content}})


INJECTED_PAGE = orjson.dumps(
    {
        "code": 200,
        "data": {"title": "FAKE-INJECTED", "url": "https://x/", "content": "FAKE-INJECTED"},
    }
)


def foreign(marker: str, observation: str, markers: set[str]) -> list[str]:
    """The other calls' markers an observation shows: another session's data."""
    return [other for other in markers - {marker} if other in observation]


def unique_markers(call: str) -> list[list[str]]:
    """Each session's own queries (or pages), none asked twice: every call a cache miss."""
    if call == "search":
        return [[f"q{n}x{c}z" for c in range(CALLS)] for n in range(SESSIONS)]
    return [[f"https://p{n}x{c}z.example/" for c in range(CALLS)] for n in range(SESSIONS)]


def half_repeated_markers(call: str) -> list[list[str]]:
    """Every other call asks what every session asks at that step: the cache's hits and its
    collapsed in-flight calls, served across sessions. (No marker is a substring of another.)"""
    shared = [f"w{c}y" if call == "search" else f"https://w{c}y.example/" for c in range(CALLS)]
    own = unique_markers(call)
    return [[shared[c] if c % 2 else own[n][c] for c in range(CALLS)] for n in range(SESSIONS)]


Answers = list[tuple[str, dict[str, Any]]]


def through_tool_server(
    upstream: HostileUpstream,
    call: str,
    markers: list[list[str]],
    replay: bool = False,
    think: float = 0.0,
) -> tuple[Answers, Answers, int]:
    """The sessions' calls through a tool server on loopback (its search and page caches on,
    as deployed), then, with `replay`, every call again from new sessions once all are done:
    what the caches serve for their TTL (an hour; failures 10 s) after the load. Each session
    pauses `think` seconds between its calls (the replay does not: the caches answer it).
    Returns both rounds' answers and how many requests the replay sent the upstream."""
    settings = UpstreamSettings(upstream.url, retry=PATIENT, max_concurrency=4, read_timeout_s=5)
    config = ToolServerConfig(
        search="serper", reader="jina", serper=settings, jina=settings, index_cache=False
    )
    metrics = ServiceMetrics("tool")
    search, reader = build_providers(config, metrics)
    app = create_app(ToolExecutor(config, search, reader, metrics), metrics)

    def session(number: int, prefix: str = "s", pause: float = think) -> Answers:
        seen = []
        with httpx.Client(base_url=base, timeout=60) as http:
            for step, marker in enumerate(markers[number]):
                time.sleep(pause if step else 0)
                arguments = {"query": marker} if call == "search" else {"url": marker}
                body = {"session_id": f"{prefix}{number}", "name": call, "arguments": arguments}
                reply = http.post("/tool", json=body)
                assert reply.status_code == 200, (marker, reply.status_code)
                seen.append((marker, reply.json()))
        return seen

    def again(number: int) -> Answers:
        return session(number, "r", 0.0)

    with serve_in_thread(app) as base, ThreadPoolExecutor(SESSIONS) as pool:
        answers = [pair for seen in pool.map(session, range(SESSIONS)) for pair in seen]
        asked = upstream.requests
        replayed = (
            [pair for seen in pool.map(again, range(SESSIONS)) for pair in seen] if replay else []
        )
    return answers, replayed, upstream.requests - asked


def assert_each_session_its_own(answers: Answers, calls: int = SESSIONS * CALLS) -> list[str]:
    """No call shows the attacker's or another call's data; the failures are clean and named
    and (the retries make most calls whole) few. Returns the failed calls' markers."""
    markers = {marker for marker, _ in answers}
    assert len(answers) == calls
    crossed, failed = [], []
    for marker, reply in answers:
        observation = str(reply.get("output") or reply.get("observation") or "")
        assert "FAKE-INJECTED" not in observation, (marker, observation[:200])
        crossed += foreign(marker, observation, markers)
        if reply.get("error"):
            failed.append(reply["error"]["code"])  # a clean, named tool error is allowed
        else:
            assert marker in observation, (marker, observation[:200])
    assert crossed == []
    assert set(failed) <= {"upstream_bad_response", "upstream_unavailable", "deadline_exceeded"}
    # a defence that refused everything would pass above
    assert len(failed) <= len(answers) // 4, failed
    return [marker for marker, reply in answers if reply.get("error")]


@pytest.mark.usefixtures("serper_key")
@pytest.mark.parametrize(("behaviour", "late_s"), unasked_cases(slow_early_head=True))
def test_an_unasked_reply_never_reaches_another_search(
    behaviour: Misbehaviour, late_s: float
) -> None:
    with hostile_upstream(searched, behaviour, INJECTED_RESULTS, late_s) as upstream:
        markers = unique_markers("search")
        answers, _, _ = through_tool_server(upstream, "search", markers, think=think_s(late_s))
    assert_each_session_its_own(answers)


@pytest.mark.usefixtures("serper_key")
@pytest.mark.parametrize(("behaviour", "late_s"), unasked_cases())
def test_an_unasked_reply_never_reaches_another_open(
    behaviour: Misbehaviour, late_s: float
) -> None:
    with hostile_upstream(read_page, behaviour, INJECTED_PAGE, late_s) as upstream:
        markers = unique_markers("open")
        answers, _, _ = through_tool_server(upstream, "open", markers, think=think_s(late_s))
    assert_each_session_its_own(answers)


@pytest.mark.usefixtures("serper_key")
@pytest.mark.parametrize(
    ("call", "behaviour", "late_s"),
    [
        pytest.param("search", *case.values, marks=case.marks, id=f"search-{case.id}")
        for case in unasked_cases(slow_early_head=True)
    ]
    + [
        pytest.param("open", *case.values, marks=case.marks, id=f"open-{case.id}")
        for case in unasked_cases()
    ],
)
def test_the_cache_never_serves_an_unasked_reply_to_another_session(
    call: str, behaviour: Misbehaviour, late_s: float
) -> None:
    """Half the calls ask what every session asks (a cache hit, or one upstream call shared),
    then every call is asked again from new sessions: all of them must still be the asker's
    own results, the second round served by the cache (its TTL is an hour) without the
    upstream."""
    answer, inject = (
        (searched, INJECTED_RESULTS) if call == "search" else (read_page, INJECTED_PAGE)
    )
    with hostile_upstream(answer, behaviour, inject, late_s) as upstream:
        markers = half_repeated_markers(call)
        answers, replayed, replay_asked = through_tool_server(
            upstream, call, markers, replay=True, think=think_s(late_s)
        )
    failed = set(assert_each_session_its_own(answers))
    assert_each_session_its_own(replayed)
    # The replay is the cache's: no request reaches the upstream but for what failed in the
    # first round (a failure is kept 10 s, then asked again: 4 attempts at most), and what
    # the first round got whole, the cache serves whole again.
    assert replay_asked <= 4 * len(failed), (replay_asked, failed)
    replay_failed = {marker for marker, reply in replayed if reply.get("error")}
    assert replay_failed <= failed, replay_failed - failed


@pytest.mark.usefixtures("serper_key")
@pytest.mark.parametrize("behaviour", ["endless_line", "endless_fields"])
@pytest.mark.parametrize("call", ["search", "open"])
def test_a_head_without_end_is_a_named_tool_error_within_the_deadline(
    call: str, behaviour: Misbehaviour
) -> None:
    """Through the tool server: a clean, named tool error long before the call's deadline
    (10 s here; each of the 4 attempts' read timeout 5 s), never a 5xx, and the next call on
    the same server is served as well."""
    answer = searched if call == "search" else read_page
    with hostile_upstream(answer, behaviour) as upstream:
        settings = UpstreamSettings(upstream.url, retry=PATIENT, read_timeout_s=5)
        config = ToolServerConfig(
            search="serper", reader="jina", serper=settings, jina=settings, call_deadline_s=10
        )
        metrics = ServiceMetrics("tool")
        search, reader = build_providers(config, metrics)
        app = create_app(ToolExecutor(config, search, reader, metrics), metrics)
        with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as http:
            replies = []
            for number in range(2):
                marker = f"q{number}z" if call == "search" else f"https://p{number}z.example/"
                arguments = {"query": marker} if call == "search" else {"url": marker}
                started = time.monotonic()
                body = {"session_id": "s", "name": call, "arguments": arguments}
                reply = http.post("/tool", json=body)
                replies.append((reply, time.monotonic() - started))
        written = upstream.endless_bytes
    for reply, seconds in replies:
        assert reply.status_code == 200
        error = reply.json()["error"]
        assert error["code"] in {"upstream_unavailable", "upstream_bad_response"}, error
        assert "timed out" not in error["message"], error
        assert seconds < 5, seconds  # not one read timeout, let alone the deadline
    assert written < 8 * 1024 * MAX_HEAD_BYTES, written  # 2 calls x 4 attempts, each cut short


def test_a_search_reply_for_another_query_is_retried_then_refused_and_not_cached() -> None:
    asked: list[str] = []

    def stale(path: str, body: bytes) -> bytes:  # answers every query with the first one's
        asked.append(orjson.loads(body)["q"])
        return searched(path, orjson.dumps({"q": asked[0]}))

    with hostile_upstream(stale, "honest") as upstream:
        serper = SerperSearch(UpstreamSettings(upstream.url, retry=PATIENT), "k" * 12)

        async def two() -> tuple[Any, BaseException | None]:
            first = await serper.search("first", 3, time.monotonic() + 30)
            try:
                await serper.search("second", 3, time.monotonic() + 30)
            except UpstreamBadResponse as exc:
                return first, exc
            finally:
                await serper.aclose()
            return first, None

        first, refused = asyncio.run(two())
    assert [r.title for r in first] == ["first 0", "first 1", "first 2"]
    from services.client.http import (
        MismatchedReply,  # here: so the old code's run collects the rest
    )

    assert isinstance(refused, UpstreamBadResponse)
    assert not isinstance(refused, MismatchedReply)
    assert "another query" in refused.message and "after 4 attempts" in refused.message
    assert asked == ["first"] + ["second"] * 4


@pytest.mark.anyio
@pytest.mark.parametrize(("behaviour", "late_s"), unasked_cases())
async def test_an_unasked_reply_never_becomes_another_answers_verdict(
    behaviour: Misbehaviour, late_s: float
) -> None:
    with hostile_upstream(grades, behaviour, ALWAYS_RIGHT, late_s) as upstream:
        settings = UpstreamSettings(upstream.url + "/v1", retry=PATIENT, max_concurrency=4)
        judge = OpenAIJudge(settings, "judge-key", model="m", metrics=ServiceMetrics("reward"))

        async def grade(number: int) -> tuple[bool, bool | None]:
            right = number % 2 == 0
            answer = "Paris" if right else f"Lyon {number}"
            # 10 s: the head of an unasked reply would hold a reused connection that long
            verdict = await judge.judge(QUESTION, ("Paris",), answer, time.monotonic() + 10)
            return right, verdict.correct

        async def session(number: int) -> list[tuple[bool, bool | None]]:
            seen = []
            for call in range(CALLS):
                await asyncio.sleep(think_s(late_s) if call else 0)
                seen.append(await grade(number * CALLS + call))
            return seen

        try:
            verdicts = [
                pair
                for seen in await asyncio.gather(*(session(n) for n in range(SESSIONS)))
                for pair in seen
            ]
        finally:
            await judge.aclose()
    assert [n for n, (right, correct) in enumerate(verdicts) if correct and not right] == []
    assert [n for n, (right, correct) in enumerate(verdicts) if correct is None] == []
    assert all(correct for right, correct in verdicts if right)


def finished_with(answer: str) -> str:
    """A well-formed trajectory (a search, then finish) whose final answer is `answer`."""
    return (
        format_tool_call("search", {"query": "capital of France"})
        + format_observation("...")
        + format_tool_call(FINISH, {"answer": answer})
    )


def half_repeated_answers() -> list[list[str]]:
    """Each session's answers: every other one right ("Paris", one verdict for all); of the
    wrong ones, half the session's own, half what every session answers at that step."""
    return [
        [
            "Paris" if c % 2 == 0 else f"Lyon {c}" if c % 4 == 3 else f"Lyon {n}x{c}"
            for c in range(CALLS)
        ]
        for n in range(SESSIONS)
    ]


@pytest.mark.usefixtures("judge_key")
@pytest.mark.parametrize(("behaviour", "late_s"), unasked_cases())
def test_the_reward_server_never_rewards_an_unasked_reply(
    behaviour: Misbehaviour, late_s: float
) -> None:
    """The load through the reward server's POST /evaluate on loopback (judge="openai" as
    deployed, its verdict cache on): 16 sessions x 12 evaluations on 4 connections to a judge
    that writes an unasked `correct: yes` after each answer. No wrong answer is rewarded 1,
    none waits past the deadline, and, once the judge is gone, what the verdict cache still
    serves is each answer's own verdict."""
    deadline_s = 10.0
    with hostile_upstream(grades, behaviour, ALWAYS_RIGHT, late_s) as upstream:
        settings = UpstreamSettings(
            upstream.url + "/v1", retry=PATIENT, max_concurrency=4, read_timeout_s=5
        )
        config = RewardServerConfig(judge="openai", judge_upstream=settings, deadline_s=deadline_s)
        metrics = ServiceMetrics("reward")
        judge = build_judge(config, metrics)
        assert isinstance(judge, OpenAIJudge)
        app = create_reward_app(config, Evaluator(judge, config.deadline_s), metrics)
        answers = half_repeated_answers()

        def session(number: int) -> list[tuple[str, dict[str, Any], float]]:
            seen = []
            with httpx.Client(base_url=base, timeout=60) as http:
                for step, answer in enumerate(answers[number]):
                    time.sleep(think_s(late_s) if step else 0)
                    body = {
                        "response": finished_with(answer),
                        "label": "Paris",
                        "remote_env_info": {"forbidden_texts": [QUESTION]},
                    }
                    started = time.monotonic()
                    reply = http.post("/evaluate", json=body)
                    assert reply.status_code == 200, (answer, reply.status_code)
                    seen.append((answer, reply.json(), time.monotonic() - started))
            return seen

        with serve_in_thread(app) as base, ThreadPoolExecutor(SESSIONS) as pool:
            results = [triple for seen in pool.map(session, range(SESSIONS)) for triple in seen]
    assert len(results) == SESSIONS * CALLS
    wrongly_rewarded = [
        answer for answer, body, _ in results if body["reward"] and answer != "Paris"
    ]
    assert wrongly_rewarded == []
    failed = [body["error"]["code"] for _, body, _ in results if body["error"]]
    assert set(failed) <= {"upstream_unavailable", "upstream_bad_response", "deadline_exceeded"}
    assert len(failed) <= len(results) // 4, failed
    assert all(
        body["reward"] for answer, body, _ in results if answer == "Paris" and not body["error"]
    )
    assert max(seconds for _, _, seconds in results) < deadline_s + 2
    # The judge is gone (its port closed): an answer the cache holds comes back as its
    # verdict, one it does not as a failure to connect.
    distinct = sorted({answer for row in answers for answer in row})
    cached = asyncio.run(cached_verdicts(judge, distinct))
    assert [
        answer
        for answer, verdict in cached.items()
        if verdict.correct is not (answer == "Paris") and verdict.correct is not None
    ] == []
    assert cached["Paris"].correct is True  # asked 96 times: its verdict is kept


async def cached_verdicts(judge: OpenAIJudge, answers: list[str]) -> dict[str, Verdict]:
    try:
        return {
            answer: await judge.judge(QUESTION, ("Paris",), answer, time.monotonic() + 5)
            for answer in answers
        }
    finally:
        await judge.aclose()


@pytest.fixture
def judge_key(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DEEPDIVE_JUDGE_API_KEY", "judge-key-0123456789")
    yield


@pytest.mark.anyio
async def test_a_judges_redirect_with_a_json_body_is_no_verdict_and_not_cached() -> None:
    """The 302's JSON body (`correct: yes`) is no verdict, the first time or the next: the same
    answer asked again within the failure TTL is the same named failure (kept that long, as
    every judge failure is, so a whole group does not hammer a broken judge), never a verdict;
    past it, the answer reaches the judge again (kept no longer than a failure)."""
    failure_ttl_s = 0.2
    with hostile_upstream(grades, "redirect_json", ALWAYS_RIGHT) as upstream:
        settings = UpstreamSettings(upstream.url + "/v1", retry=PATIENT)
        cache = CacheSettings(ttl_s=3600, failure_ttl_s=failure_ttl_s)
        judge = OpenAIJudge(settings, "judge-key", "m", cache, ServiceMetrics("reward"))
        verdicts, asked = [], []
        try:
            for wait_s in (0, 0, failure_ttl_s + 0.1):
                await asyncio.sleep(wait_s)
                deadline = time.monotonic() + 30
                verdicts.append(await judge.judge(QUESTION, ("Paris",), "Lyon", deadline))
                asked.append(upstream.requests)
        finally:
            await judge.aclose()
    for verdict in verdicts:
        assert verdict.correct is None
        assert verdict.error is not None and "HTTP 302 is not an answer" in verdict.error.message
    assert asked == [1, 1, 2], "a redirect's failure must be kept no longer than its TTL"
