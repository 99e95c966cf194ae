"""Thousands of malformed and hostile requests against the real servers, and not one 500
(hypothesis): arbitrary Unicode in every string field, numbers that only look like numbers,
IDNA and malformed URLs, redirects to malformed addresses, half-written tool calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deepdive.protocol import FINISH, format_observation, format_tool_call
from services.reward_server.app import create_app as create_reward_app
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.reward_server.rule_judge import RuleJudge
from services.serving.metrics import ServiceMetrics
from services.tool_server.app import create_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.direct import DirectReader
from services.tool_server.tools import ToolExecutor
from services.tool_server.urlguard import URLGuard
from tests import hostile
from tests.helpers import serve_in_thread

FUZZ = settings(
    max_examples=2500, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
OK_STATUSES = (200, 400, 413, 422)

envelopes = st.fixed_dictionaries(
    {},
    optional={
        "session_id": hostile.unicode_text | st.text(max_size=300) | hostile.json_values,
        "name": hostile.tool_names | hostile.json_values,
        "arguments": hostile.tool_arguments | hostile.json_values,
        "remote_env_info": st.fixed_dictionaries(
            {}, optional={"forbidden_texts": st.lists(hostile.unicode_text) | hostile.json_values}
        )
        | hostile.json_values,
    },
)
well_formed_envelopes = st.fixed_dictionaries(
    {
        "session_id": st.sampled_from(["s1", "s2"]),
        "name": st.sampled_from(["search", "click", "open", "close_session"]),
        "arguments": hostile.tool_arguments,
        "remote_env_info": st.fixed_dictionaries(
            {"forbidden_texts": st.lists(hostile.unicode_text, max_size=2)}
        ),
    }
)


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


bodies = (
    envelopes.map(dumps)
    | well_formed_envelopes.map(dumps)
    | hostile.json_values.map(dumps)
    | st.binary(max_size=200)
    | envelopes.map(lambda e: dumps(e)[:-1])  # truncated JSON
)


def check_tool_reply(response: httpx.Response) -> None:
    assert response.status_code in OK_STATUSES, response.text
    payload: Any = response.json()
    if response.status_code == 200:
        assert isinstance(payload["output"], str) and payload["output"] == payload["observation"]
    else:
        assert payload["error"]["code"] and payload["error"]["message"]


@pytest.mark.slow
def test_no_malformed_request_gets_a_500(corpus_file: Path, tmp_path: Path) -> None:
    config = ToolServerConfig(
        corpus=corpus_file,
        index_cache_dir=tmp_path / "idx",
        page_chars=300,
        call_deadline_s=5,
        max_query_chars=30,
    )
    metrics = ServiceMetrics("tool")
    search, reader = build_providers(config, metrics)
    app = create_app(ToolExecutor(config, search, reader, metrics), metrics)
    seen: set[int] = set()

    with serve_in_thread(app) as base, httpx.Client(base_url=base) as client:

        @FUZZ
        @given(body=bodies)
        def check(body: bytes) -> None:
            response = client.post(
                "/tool", content=body, headers={"content-type": "application/json"}
            )
            seen.add(response.status_code)
            check_tool_reply(response)

        check()
    assert {200, 400, 422} <= seen  # the generator really reached every kind of answer


@pytest.fixture
def hostile_site() -> Iterator[str]:
    """A site whose /hop?to=X answers a redirect to X, and whose /page answers HTML."""

    async def hop(request: Request) -> Response:
        return Response(status_code=302, headers={"location": request.query_params.get("to", "")})

    async def page(_: Request) -> Response:
        return Response("<p>a page</p>", media_type="text/html")

    app = Starlette(routes=[Route("/hop", hop), Route("/page", page)])
    with serve_in_thread(app) as base:
        yield base


@pytest.mark.slow
def test_the_direct_reader_answers_every_url_and_redirect(
    corpus_file: Path, tmp_path: Path, hostile_site: str
) -> None:
    """`open` through the direct reader: IDNA hosts, malformed IPv4, and redirects from a
    trusted test site to arbitrary locations, the malformed ones included."""
    config = ToolServerConfig(
        corpus=corpus_file, index_cache_dir=tmp_path / "idx", call_deadline_s=5
    )
    metrics = ServiceMetrics("tool")
    search, _ = build_providers(config, metrics)
    # Loopback is trusted here, so redirects from the test site are followed and checked.
    reader = DirectReader(config.direct, URLGuard(["127.0.0.0/8"]), metrics=metrics)
    app = create_app(ToolExecutor(config, search, reader, metrics), metrics)
    locations = hostile.urls | st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30
    )
    with serve_in_thread(app) as base, httpx.Client(base_url=base) as client:

        @settings(
            max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(url=hostile.urls, location=locations)
        def check(url: str, location: str) -> None:
            for target in (url, f"{hostile_site}/hop?{httpx.QueryParams({'to': location})}"):
                body = {"session_id": "s", "name": "open", "arguments": {"url": target}}
                check_tool_reply(client.post("/tool", json=body))

        check()


trajectories = st.lists(
    hostile.model_turns | hostile.unicode_text.map(format_observation), max_size=4
).map("".join) | st.builds(
    lambda turns, answer: "".join(turns) + format_tool_call(FINISH, {"answer": answer}),
    st.lists(hostile.model_turns, max_size=3),
    hostile.unicode_text,
)
evaluation_items = st.fixed_dictionaries(
    {"response": trajectories, "label": st.just("Paris") | hostile.json_values},
    optional={
        "prompt": hostile.unicode_text | hostile.json_values,
        "history": hostile.json_values,
        "task_unfinished": hostile.json_values,
        "format_valid": hostile.json_values,
        "remote_env_info": st.fixed_dictionaries(
            {}, optional={"forbidden_texts": st.lists(hostile.unicode_text) | hostile.json_values}
        ),
    },
)


@pytest.mark.slow
def test_the_reward_server_never_answers_500() -> None:
    """/evaluate and /evaluate/batch on hostile trajectories and arbitrary fields: a 200 with a
    reward for every item, or a 4xx naming the field; never a 500, never a lost item."""
    app = create_reward_app(
        RewardServerConfig(), Evaluator(RuleJudge(), 10), ServiceMetrics("reward")
    )
    with serve_in_thread(app) as base, httpx.Client(base_url=base) as client:

        @FUZZ
        @given(items=st.lists(evaluation_items, min_size=1, max_size=4))
        def check(items: list[dict[str, Any]]) -> None:
            single = client.post("/evaluate", content=dumps(items[0]))
            assert single.status_code in (200, 422), single.text
            if single.status_code == 200:
                assert single.json()["reward"] in (0, 1)
            batch = client.post("/evaluate/batch", content=dumps(items))
            assert batch.status_code in (200, 422), batch.text
            if batch.status_code == 200:
                assert len(batch.json()) == len(items)
                assert all(result["reward"] in (0, 1) for result in batch.json())

        check()
