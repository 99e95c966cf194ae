"""The HTTP envelopes of deepdive.protocol, which both ends use: the rollout writes a
ToolRequest and a RewardRequest and reads their replies; the tool and reward servers parse the
requests and write the replies. Each form read back as written, the servers' parse refusing
by field name, the readers never raising on what a server may answer, and a failed tool
call's error reaching the rollout with its kind."""

from __future__ import annotations

import contextlib
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings

from deepdive.generate import generate_with_tool
from deepdive.protocol import (
    TOOL_ERROR_KINDS,
    Failure,
    RewardReply,
    RewardRequest,
    ToolReply,
    ToolRequest,
    format_tool_call,
    tool_error_kind,
)
from deepdive.reward import reward_request
from deepdive.sample import SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn
from services.base.errors import RequestError, UpstreamBadResponse
from tests import hostile
from tests.helpers import FORBIDDEN_QUESTION, PROMPT, make_args, new_sample, serve_in_thread

episode_test = pytest.mark.usefixtures("rollout_clients")
SEARCH = format_tool_call("search", {"query": "silver orrery Haldor"})
FINISH = format_tool_call("finish", {"answer": "Ilse Varen"})


def test_a_tool_request_reads_back_as_written() -> None:
    request = ToolRequest("s-1", "search", {"query": "orrery", "num": 3}, ("who made it?",))
    assert ToolRequest.parse(orjson.loads(orjson.dumps(request.as_json()))) == request
    # DeepDive's own envelope: remote_env_info may be absent or null, arguments null
    assert ToolRequest.parse({"session_id": "s", "name": "open", "arguments": None}) == (
        ToolRequest("s", "open", {}, ())
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "the request body must be a JSON object, got a list"),
        ({"name": "search"}, "field 'session_id': expected a non-empty string, got nothing"),
        ({"session_id": "s", "name": 3}, "field 'name': expected a string (the tool name)"),
        (
            {"session_id": "s", "name": "x", "remote_env_info": {"forbidden_texts": [1]}},
            "field 'remote_env_info.forbidden_texts': expected a list of strings",
        ),
    ],
)
def test_a_tool_request_that_is_no_envelope_is_refused_by_field(body: Any, field: str) -> None:
    with pytest.raises(RequestError, match=field.replace("(", r"\(").replace(")", r"\)")):
        ToolRequest.parse(body)


def test_a_tool_reply_carries_its_error_with_its_kind() -> None:
    failed = ToolReply("serper: HTTP 503", Failure("upstream_unavailable", "serper: HTTP 503"))
    body = failed.as_json()
    assert body == {
        "output": "serper: HTTP 503",
        "observation": "serper: HTTP 503",
        "error": {
            "code": "upstream_unavailable",
            "kind": "upstream_unavailable",
            "message": "serper: HTTP 503",
        },
    }
    assert ToolReply.parse(body) == failed and ToolReply.parse(body).error_kind == (
        "upstream_unavailable"
    )
    # the model's own mistakes are no tool error
    assert ToolReply("no", Failure("invalid_link_id", "no")).error_kind is None
    assert ToolReply.parse({"output": "DeepDive's server sends only output"}).error is None


def test_every_infrastructure_code_has_a_documented_kind() -> None:
    codes = {
        "upstream_unavailable": "upstream_unavailable",
        "upstream_error": "upstream_unavailable",
        "upstream_rate_limited": "rate_limited",
        "upstream_auth": "auth",
        "deadline_exceeded": "deadline",
        "upstream_bad_response": "bad_response",
        "tool_server_failed": "tool_server",
    }
    assert {code: tool_error_kind(code) for code in codes} == codes
    assert set(codes.values()) == set(TOOL_ERROR_KINDS)
    for mistake in ("invalid_arguments", "invalid_link_id", "url_rejected", "page_not_found"):
        assert tool_error_kind(mistake) is None


@pytest.mark.parametrize(
    "body", [[], {"observation": ["a", "list"]}, {"output": 3}, {"error": "no text"}]
)
def test_a_tool_reply_that_is_no_envelope_is_a_bad_response(body: Any) -> None:
    """It was read with body.get("observation", body.get("output", "")): a list became its
    repr in the model's observation, a missing observation an empty one."""
    with pytest.raises(UpstreamBadResponse):
        ToolReply.parse(body)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=hostile.json_values)
def test_reading_any_reply_raises_nothing_unexpected(body: Any) -> None:
    try:
        reply = ToolReply.parse(body)
        assert isinstance(reply.observation, str)
    except UpstreamBadResponse:
        pass
    answer = RewardReply.parse(body)  # never raises
    assert isinstance(answer.reward, int | float) and answer.reward == answer.reward


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=hostile.json_values)
def test_parsing_any_request_raises_only_request_errors(body: Any) -> None:
    for parse in (ToolRequest.parse, RewardRequest.parse):
        with contextlib.suppress(RequestError):
            parse(body)


def test_the_rollouts_reward_request_is_what_the_reward_server_reads() -> None:
    sample = new_sample()
    sample.response, sample.prompt = FINISH, PROMPT
    written = reward_request(sample)
    read = RewardRequest.parse(orjson.loads(orjson.dumps(written.as_json())))
    assert read.labels == ("Ilse Varen", "I. Varen")
    assert read.question == FORBIDDEN_QUESTION and read.trajectory == FINISH
    assert read.client_unfinished  # still PENDING: not COMPLETED
    assert read.forbidden_texts == (FORBIDDEN_QUESTION,)
    assert RewardRequest.parse(read.as_json()) == read


@pytest.mark.parametrize(
    ("body", "reward", "code"),
    [
        ({"reward": 1, "extracted_answer": "x"}, 1, None),
        ({"reward": True}, 0, "bad_reply"),
        ({"reward": float("inf")}, 0, "bad_reply"),
        ({"reward": "1"}, 0, "bad_reply"),
        ({"reward": 0, "error": {"code": "upstream_unavailable", "message": "judge"}}, 0, None),
        ("not an object", 0, "bad_reply"),
    ],
)
def test_a_reward_reply_is_a_finite_number_or_zero_with_why(
    body: Any, reward: float, code: str | None
) -> None:
    answer = RewardReply.parse(body)
    assert answer.reward == reward
    if code is not None:
        assert answer.error is not None and answer.error.code == code


@pytest.mark.anyio
@episode_test
async def test_a_failed_tool_call_reaches_the_rollout_with_its_kind(
    services: dict[str, str],
) -> None:
    """The tool server's errors are counted by kind in the episode's statistics (the key
    `tool_errors`, kinds from deepdive.protocol.TOOL_ERROR_KINDS), with what the tool said; a
    tool server that is down counts as kind tool_server. The model's mistakes count nothing."""
    click = format_tool_call("click", {"link_id": 9})  # no search yet: the model's mistake
    fake = FakeSGLang([ScriptedTurn(click), ScriptedTurn(SEARCH), ScriptedTurn(FINISH)])
    with serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, services, on_malformed="continue")
        sample = await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096})
    assert sample.status is SampleStatus.COMPLETED
    assert sample.metadata["deepdive"]["tool_errors"] == {}
    # the same episode against a tool server whose replies are no envelopes
    fake = FakeSGLang([ScriptedTurn(SEARCH), ScriptedTurn(FINISH)])
    with serve_in_thread(_not_an_envelope()) as tools, serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, {**services, "tools": tools})
        sample = await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096})
    stats = sample.metadata["deepdive"]
    assert stats["tool_errors"] == {"tool_server": 1}
    [(words, count)] = stats["tool_error_words"].items()
    assert count == 1 and "observation is a list" in words
    assert "The tool server could not run search" in sample.response


def _not_an_envelope() -> Any:
    """A tool server that passes the rollout's /health check and answers /tool with an
    observation that is a list."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b'{"status": "ok"}' if scope["path"] == "/health" else b'{"observation": [1]}'
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def test_the_tool_servers_reply_to_the_models_mistake_has_no_kind(
    services: dict[str, str],
) -> None:
    """A click the model got wrong: an error without a tool-error kind, on HTTP 200."""
    reply = httpx.post(
        services["tools"] + "/tool",
        json=ToolRequest("s", "click", {"link_id": 1}).as_json(),
    )
    assert reply.status_code == 200
    assert reply.json()["error"] == {
        "code": "invalid_link_id",
        "kind": None,
        "message": reply.json()["observation"],
    }
