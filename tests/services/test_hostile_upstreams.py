"""Upstreams that break HTTP framing (fakes/hostile_upstream.py) against every client the project
uses: the lean client of the rollout's cluster hops (`plain_http=True`) and aiohttp for what
leaves the cluster, directly and through the tool server's search and the reward server's
judge. Each caller must get its own reply or a clean error, never another caller's: a reply
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

from fakes.hostile_upstream import Misbehaviour, hostile_upstream
from services.base.errors import ConfigError, UpstreamError
from services.http import RetryPolicy, Upstream, UpstreamSettings
from services.metrics import ServiceMetrics
from services.plain_http import MAX_HEAD_BYTES, check_header
from services.reward_server.openai_judge import OpenAIJudge
from services.tool_server.app import create_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.tools import ToolExecutor
from tests.helpers import serve_in_thread

ONCE = RetryPolicy(max_attempts=1)
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


AIOHTTP_REUSES_A_POISONED_CONNECTION = pytest.mark.xfail(
    reason="aiohttp 3.14.5 parses bytes that arrive on an idle pooled connection and hands "
    "them to the next request (its connector's _get does not check should_close; "
    "aio-libs/aiohttp#13656). Strict: this fails once aiohttp fixes it.",
    strict=True,
)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "kind", ["lean", pytest.param("aiohttp", marks=AIOHTTP_REUSES_A_POISONED_CONNECTION)]
)
async def test_bytes_that_arrive_on_an_idle_connection_close_it(kind: str) -> None:
    """A reply longer than its length whose extra bytes come in a later segment, while the
    connection idles in the pool: the next request must go out on a fresh connection."""
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


# Through the services: Serper behind the tool server, an OpenAI-compatible judge behind the
# reward server's evaluator (both always aiohttp, whatever their URL's scheme).


def organic(path: str, body: bytes) -> bytes:
    query = orjson.loads(body)["q"]
    results = [{"title": f"{query} {i}", "link": f"https://r{i}.example/{query}"} for i in range(3)]
    return orjson.dumps({"organic": results})


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
    with hostile_upstream(organic, behaviour, INJECTED_RESULTS) as upstream:
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
