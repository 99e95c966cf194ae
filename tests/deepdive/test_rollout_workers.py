"""The rollout against a tool server of two worker processes (real processes, HTTP on
loopback, the fake Serper counting its calls): each episode keeps to the worker its prompt
picks, so a click always finds its session's search, and a GRPO group's identical first
searches cost one upstream call."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from deepdive.generate import generate_with_tool
from deepdive.protocol import format_tool_call
from deepdive.routing import worker_for, worker_index
from deepdive.sample import LocalSample, SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn
from fakes.upstream import create_app as create_upstream_app
from services.base.process import ServiceProcess
from tests.helpers import DOCUMENTS, make_args, serve_in_thread

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("rollout_clients")]

NO_SEARCH = "no search results to click"
CLICKED = "no page at https://bench.example/"  # link 1 of the fake Serper's results, opened


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The fake Serper (50 ms a call: identical calls overlap) and a two-worker tool server."""
    folder = tmp_path_factory.mktemp("workers")
    corpus = folder / "corpus.jsonl"
    corpus.write_bytes(b"\n".join(orjson.dumps(doc) for doc in DOCUMENTS) + b"\n")
    with serve_in_thread(create_upstream_app(0.05)) as upstream:
        arguments = [
            "tools", "--workers", "2", "--search", "serper", "--serper.base-url", upstream,
            "--reader", "offline", "--corpus", str(corpus), "--index-cache-dir", str(folder / "idx"),
            "--log-level", "WARNING",
        ]  # fmt: skip
        environment = {"SERPER_API_KEY": "a-test-key-not-a-secret"}
        with ServiceProcess("tools", arguments, folder / "tools.log", 60, environment) as tools:
            yield {"upstream": upstream, "tools": tools.url, "urls": tools.urls}


def query_of(prompt: str) -> str:
    return "first search for " + prompt.split("\n", 1)[0]


def choose(text: str) -> ScriptedTurn:
    """Every episode: search its prompt's query, click result 1, finish."""
    observations = text.count("<observation>")
    if observations == 0:
        return ScriptedTurn(format_tool_call("search", {"query": query_of(text)}))
    if observations == 1:
        return ScriptedTurn(format_tool_call("click", {"link_id": 1}))
    return ScriptedTurn(format_tool_call("finish", {"answer": "x"}))


def prompt(name: str) -> str:
    return f"{name}\n<|im_start|>user\nWho built the orrery?<|im_end|>\n<|im_start|>assistant\n"


async def play(stack: dict[str, Any], prompts: list[str]) -> list[LocalSample]:
    """One episode per prompt, all at once, as slime plays a rollout batch."""
    with serve_in_thread(FakeSGLang([], choose=choose).app()) as sglang:
        args = make_args(sglang, {"tools": stack["urls"], "reward": "http://127.0.0.1:9"})
        samples = [LocalSample(prompt=p, label="x") for p in prompts]
        params = {"max_new_tokens": 4096, "temperature": 1.0}
        return list(await asyncio.gather(*(generate_with_tool(args, s, params) for s in samples)))


def tool_requests(url: str) -> float:
    """Tool calls a worker has answered (its own /metrics: workers share no counters)."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("deepdive_tool_requests_total{")
    )


def upstream_calls(stack: dict[str, Any]) -> int:
    calls: int = httpx.get(f"{stack['upstream']}/stats").json()["calls"]
    return calls


@pytest.mark.anyio
async def test_a_grpo_group_lands_on_one_worker_and_pays_its_first_search_once(
    stack: dict[str, Any],
) -> None:
    group = [prompt("group question")] * 8  # a GRPO group: every sample has the same prompt
    before = [tool_requests(url) for url in stack["urls"]]
    calls = upstream_calls(stack)
    samples = await play(stack, group)
    assert all(s.status is SampleStatus.COMPLETED for s in samples)
    assert all(CLICKED in s.response and NO_SEARCH not in s.response for s in samples)
    assert upstream_calls(stack) - calls == 1  # eight identical searches, one upstream call
    grown = [tool_requests(url) - was for url, was in zip(stack["urls"], before, strict=True)]
    chosen = worker_index(group[0], 2)
    assert grown[chosen] == 8 * 3 and grown[1 - chosen] == 0  # search, click, close_session
    assert worker_for(group[0], stack["urls"]) == stack["urls"][chosen]


@pytest.mark.anyio
async def test_every_click_finds_its_sessions_search_and_both_workers_serve(
    stack: dict[str, Any],
) -> None:
    names = (f"question {n}" for n in itertools.count())
    prompts = [prompt(name) for name in itertools.islice(names, 24)]
    routed = [worker_index(p, 2) for p in prompts]
    assert set(routed) == {0, 1}  # prompts that hash apart
    before = [tool_requests(url) for url in stack["urls"]]
    samples = await play(stack, prompts * 2)  # two samples of each, all at once
    for sample in samples:
        assert sample.status is SampleStatus.COMPLETED, sample.metadata
        assert CLICKED in sample.response and NO_SEARCH not in sample.response
        assert "invalid_link_id" not in sample.response
    grown = [tool_requests(url) - was for url, was in zip(stack["urls"], before, strict=True)]
    assert grown == [2 * 3 * routed.count(0), 2 * 3 * routed.count(1)]
