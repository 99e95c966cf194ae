"""Aborted episodes against a fake SGLang that refuses, fails or aborts, the real tool and
reward servers on loopback: what SGLang said is kept in the sample's error (redacted, on one
line, bounded), and nothing SGLang sends back raises out of the rollout."""

from __future__ import annotations

import json
import logging
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepdive.aborts import MESSAGE_CHARS, sglang_message
from deepdive.clients import close_clients
from deepdive.protocol import format_tool_call
from deepdive.rollout import generate_with_tool
from deepdive.sample import LocalSample, SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn
from services.logs import register_secret
from tests.helpers import make_args, new_sample, serve_in_thread

# the rollout's pooled clients belong to each test's event loop: closed after each test
episode_test = pytest.mark.usefixtures("rollout_clients")

SEARCH = format_tool_call("search", {"query": "silver orrery Haldor"})
# SGLang's refusal of a prompt longer than the served context (HTTP 400, its error JSON)
TOO_LONG = (
    "Requested token count exceeds the model's maximum context length of 32768 tokens. "
    "You requested a total of 40123 tokens: 39000 tokens from the input messages and 1123 "
    "tokens for the completion. Please reduce the number of tokens in the input messages or "
    "the completion to fit within the limit."
)


async def play(
    script: list[ScriptedTurn], services: dict[str, str], **extra: Any
) -> tuple[LocalSample, FakeSGLang]:
    fake = FakeSGLang(script)
    retries = extra.pop("retries", 0)
    with serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, services, **extra)
        args.deepdive_retries = retries  # make_args sets none
        sample = await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096})
    return sample, fake


def error_of(sample: LocalSample) -> str:
    error = sample.metadata["deepdive"]["error"]
    assert isinstance(error, str)
    return error


@pytest.mark.anyio
@episode_test
async def test_sglangs_refusal_is_kept_in_the_samples_error(
    services: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    # The stored error was "sglang: HTTP 400 (request refused)": SGLang's reason was dropped,
    # and the episode's one trace was an INFO line.
    with caplog.at_level(logging.INFO, logger="deepdive.rollout"):
        sample, fake = await play(
            [ScriptedTurn(SEARCH), ScriptedTurn("", status=400, message=TOO_LONG)], services
        )
        routine, _ = await play([ScriptedTurn("", "abort")], services)  # slime's own abort
    assert sample.status is SampleStatus.ABORTED
    assert error_of(sample) == f"sglang: HTTP 400: {TOO_LONG}"
    assert len(fake.requests) == 2  # a refusal is not retried (retries would not help)
    levels = {r.getMessage().split(" session=")[1].split()[0]: r.levelno for r in caplog.records}
    assert levels == {sample.session_id: logging.WARNING, routine.session_id: logging.INFO}


@pytest.mark.anyio
@episode_test
async def test_a_refusal_is_not_retried_even_with_retries(services: dict[str, str]) -> None:
    script = [ScriptedTurn("", status=400, message=TOO_LONG), ScriptedTurn(SEARCH)]
    sample, fake = await play(script, services, retries=3)
    assert sample.status is SampleStatus.ABORTED and len(fake.requests) == 1
    assert TOO_LONG in error_of(sample)


@pytest.mark.anyio
@episode_test
async def test_a_routers_text_answer_is_kept_too(services: dict[str, str]) -> None:
    body = b"No healthy worker available for model: all 4 workers failed the health check"
    sample, _ = await play([ScriptedTurn("", status=422, body=body)], services)
    assert error_of(sample) == f"sglang: HTTP 422: {body.decode()}"


@pytest.mark.anyio
@episode_test
async def test_a_crashed_engine_behind_the_router_is_named_by_its_status(
    services: dict[str, str],
) -> None:
    sample, fake = await play(
        [ScriptedTurn("", status=502, body=b"upstream died")] * 2,
        services,
        retries=1,
    )
    assert sample.status is SampleStatus.ABORTED
    assert error_of(sample) == "sglang: HTTP 502 after 2 attempts"  # 5xx: retried first
    assert len(fake.requests) == 2


@pytest.mark.anyio
@episode_test
async def test_the_message_of_sglangs_own_abort_is_kept(services: dict[str, str]) -> None:
    script = [ScriptedTurn(SEARCH), ScriptedTurn("", "abort", message="Abort in waiting queue")]
    sample, _ = await play(script, services)
    assert sample.status is SampleStatus.ABORTED
    assert error_of(sample) == "sglang aborted: Abort in waiting queue"
    bare, _ = await play([ScriptedTurn("", "abort")], services)
    assert error_of(bare) == "sglang aborted"


@pytest.mark.anyio
@episode_test
async def test_secrets_in_sglangs_message_are_redacted_and_it_stays_one_bounded_line(
    services: dict[str, str],
) -> None:
    secret = "sk-deepdive-test-7f3a9c1e"
    register_secret(secret)
    message = f"bad header Authorization: Bearer {secret}\n\n" + "x" * 5000
    sample, _ = await play([ScriptedTurn("", status=400, message=message)], services)
    error = error_of(sample)
    assert secret not in error and "Bearer ***" in error
    assert "\n" not in error and len(error) <= len("sglang: HTTP 400: ") + MESSAGE_CHARS


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (orjson.dumps({"error": {"message": "too long"}}), "too long"),  # SGLang's shape
        (orjson.dumps({"error": "too long"}), "too long"),
        (orjson.dumps({"message": "too long"}), "too long"),
        (orjson.dumps({"detail": "Not Found"}), "Not Found"),
        (orjson.dumps({"detail": [{"loc": ["body"], "msg": "field required"}]}), '{"detail":'),
        (b"Bad Request", "Bad Request"),
        (b"", "(no message)"),
        (b"\xff\xfe not utf-8", "\ufffd\ufffd not utf-8"),
    ],
)
def test_sglang_message_reads_the_shapes_an_error_body_comes_in(body: bytes, words: str) -> None:
    assert sglang_message(body).startswith(words)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["error", "message", "detail", "x"]), inner, max_size=3)
    ),
    max_leaves=20,
)
ERROR_BODIES = st.one_of(st.binary(max_size=3000), JSON.map(lambda v: json.dumps(v).encode()))


@settings(max_examples=300, deadline=None, database=None)
@given(body=ERROR_BODIES)
def test_sglang_message_never_raises_and_stays_one_bounded_line(body: bytes) -> None:
    words = sglang_message(body)
    assert words and "\n" not in words and len(words) <= MESSAGE_CHARS


def test_a_body_nested_a_thousand_deep_is_read_as_text() -> None:
    body = b'{"error": ' * 1000 + b'"deep"' + b"}" * 1000
    assert sglang_message(body).startswith('{"error":')


def test_nothing_sglang_answers_raises_out_of_the_rollout(services: dict[str, str]) -> None:
    """Any status, any body, any abort message: the episode ends ABORTED (or, for a 2xx, as
    the body allows), with its arrays consistent and its error a bounded line."""
    fake = FakeSGLang([])
    with serve_in_thread(fake.app()) as sglang:

        @settings(
            max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(
            status=st.sampled_from([400, 404, 413, 422, 500, 503]),
            body=st.binary(max_size=2000),
            message=st.text(max_size=300),
        )
        def check(status: int, body: bytes, message: str) -> None:
            async def run() -> None:
                args = make_args(sglang, services)
                for turn in (
                    ScriptedTurn("", status=status, body=body),
                    ScriptedTurn("", "abort", message=message),
                ):
                    fake.script[:] = [turn]
                    sample = await generate_with_tool(args, new_sample(), {"max_new_tokens": 64})
                    assert sample.status is SampleStatus.ABORTED
                    error = error_of(sample)
                    assert "\n" not in error and len(error) <= 60 + MESSAGE_CHARS
                    assert len(sample.loss_mask or []) == sample.response_length
                await close_clients()

            anyio.run(run)

        check()
