"""Aborted episodes against a fake SGLang that refuses, fails or aborts, the real tool and
reward servers on loopback: what SGLang said is kept in the sample's error (redacted, on one
line, bounded), and nothing SGLang sends back raises out of the rollout."""

from __future__ import annotations

import io
import json
import logging
from argparse import Namespace
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from deepdive.aborts import RolloutAborted, sglang_message
from deepdive.clients import close_clients
from deepdive.generate import generate_with_tool
from deepdive.local.config import load_local_config
from deepdive.local.context import RunContext
from deepdive.local.episodes import WORLD
from deepdive.local.prompts import PromptSampler
from deepdive.local.rollouts import InProcessRollouts, settings_for
from deepdive.local.training import grpo_step
from deepdive.messages import MESSAGE_CHARS, most_said
from deepdive.protocol import format_tool_call
from deepdive.rollout_settings import (
    EVAL_LOG_FUNCTION_PATH,
    ROLLOUT_LOG_FUNCTION_PATH,
    rollout_args,
)
from deepdive.run_paths import RunPaths
from deepdive.sample import LocalSample, SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn
from services.base.logs import register_secret
from tests.helpers import (
    load_function,
    make_args,
    new_sample,
    serve_in_thread,
    slime_log_eval_rollout_data,
    slime_log_rollout_data,
)

# the rollout's pooled clients belong to each test's event loop: closed after each test
episode_test = pytest.mark.usefixtures("rollout_clients")

SEARCH = format_tool_call("search", {"query": "silver orrery Haldor"})
FINISH = format_tool_call("finish", {"answer": "Ilse Varen"})
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


# -- each rollout's aborted episodes, counted, and the run stopped when they are too many ----


async def rollout_of(
    services: dict[str, str], refused: int, answered: int, **extra: Any
) -> tuple[list[LocalSample], Namespace]:
    """A rollout's samples: `refused` episodes SGLang refused after a search (HTTP 400), and
    `answered` that finished; with the args the launcher gives slime (its log functions)."""
    samples = []
    for _ in range(refused):
        script = [ScriptedTurn(SEARCH), ScriptedTurn("", status=400, message=TOO_LONG)]
        samples.append((await play(script, services))[0])
    for _ in range(answered):
        samples.append((await play([ScriptedTurn(FINISH)], services))[0])
    args = make_args("http://127.0.0.1:9", services, **extra)
    args.custom_rollout_log_function_path = ROLLOUT_LOG_FUNCTION_PATH
    args.custom_eval_rollout_log_function_path = EVAL_LOG_FUNCTION_PATH
    return samples, args


@pytest.mark.anyio
@episode_test
async def test_a_rollout_mostly_aborted_stops_the_run_with_sglangs_words_and_the_count(
    services: dict[str, str],
) -> None:
    # It trained: every refused episode a wrong answer, one INFO line each.
    samples, args = await rollout_of(services, refused=3, answered=1)
    with pytest.raises(RolloutAborted) as stopped:
        slime_log_rollout_data(7, args, samples, {})
    message = str(stopped.value)
    assert message.startswith("rollout 7: 3 of 4 episodes ABORTED (75%)")
    assert f"SGLang said: [3x] sglang: HTTP 400: {TOO_LONG}." in message
    assert "deepdive_max_aborted_share = 0.5" in message
    assert "slime.deepdive.max_aborted_share" in message


@pytest.mark.anyio
@episode_test
async def test_each_rollouts_aborted_episodes_are_counted_in_its_metrics(
    services: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    samples, args = await rollout_of(services, refused=1, answered=3)
    with caplog.at_level(logging.WARNING, logger="deepdive.aborts"):
        logged = slime_log_rollout_data(3, args, samples, {"rollout/dynamic_filter/drop_x": 2})
    aborts = {k: v for k, v in logged.items() if "/tool_" not in k and "/agent/" not in k}
    assert aborts == {
        "rollout/dynamic_filter/drop_x": 2,  # slime's own, kept
        "rollout/deepdive/aborted": 1,
        "rollout/deepdive/aborted_ratio": 0.25,
    }
    [record] = [r for r in caplog.records if r.name == "deepdive.aborts"]
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("rollout_aborted rollout=3 ")
    assert "aborted=1 samples=4 share=0.25 error=" in record.getMessage()
    clean = slime_log_rollout_data(4, args, samples[1:], {})
    assert {k: v for k, v in clean.items() if "/tool_" not in k and "/agent/" not in k} == {
        "rollout/deepdive/aborted": 0,
        "rollout/deepdive/aborted_ratio": 0.0,
    }
    assert slime_log_rollout_data(5, args, [], None) == {}  # nothing to count, no crash


@pytest.mark.anyio
@episode_test
@pytest.mark.parametrize(
    ("refused", "answered", "share", "stops"),
    [
        (2, 2, 0.5, False),  # exactly the share: not above it
        (3, 1, 0.8, False),
        (1, 3, 0.0, True),  # 0: any aborted episode stops the run
        (4, 0, 1.0, False),  # 1: never
    ],
)
async def test_the_share_that_stops_the_run_is_a_setting(
    services: dict[str, str], refused: int, answered: int, share: float, stops: bool
) -> None:
    samples, args = await rollout_of(services, refused, answered, max_aborted_share=share)
    if stops:
        with pytest.raises(RolloutAborted):
            slime_log_rollout_data(1, args, samples, {})
    else:
        slime_log_rollout_data(1, args, samples, {})


@pytest.mark.anyio
@episode_test
async def test_an_evaluation_mostly_aborted_stops_the_run_too(services: dict[str, str]) -> None:
    samples, args = await rollout_of(services, refused=3, answered=1)
    data = {"bc": {"rewards": [0.0, 0.0, 0.0, 1.0], "samples": samples}}
    with pytest.raises(RolloutAborted, match=r"^eval bc at rollout 2: 3 of 4 episodes ABORTED"):
        slime_log_eval_rollout_data(2, args, data)
    slime_log_eval_rollout_data(2, args, {"bc": {"rewards": [1.0], "samples": samples[3:]}})


def test_samples_aborted_elsewhere_are_counted_whatever_their_metadata() -> None:
    """slime's own aborts, another hook's samples: no error of ours recorded, still counted."""
    odd = [
        LocalSample(status=SampleStatus.ABORTED),
        LocalSample(status=SampleStatus.ABORTED, metadata={"deepdive": "not a dict"}),
        LocalSample(status=SampleStatus.ABORTED, metadata=None),  # type: ignore[arg-type]
        LocalSample(status=SampleStatus.COMPLETED),
    ]
    args = make_args("http://127.0.0.1:9", {"tools": "http://t", "reward": "http://r"})
    with pytest.raises(RolloutAborted, match=r"\[3x\] no error recorded"):
        load_function(ROLLOUT_LOG_FUNCTION_PATH)(0, args, [odd], {}, 1.0)  # nested: flattened


def test_a_local_step_mostly_aborted_stops_the_run_too(tmp_path: Path) -> None:
    """`[local.rollout] max_aborted_share` is the same rule for the local run: a GRPO step whose
    episodes the engine aborted stops before it trains on them (here every episode: the
    engine aborts each turn)."""
    from deepdive.local.model import train_tokenizer

    tokenizer = train_tokenizer(["who made the orrery search finish"] * 20, vocab_size=300)
    row = {"input_messages": [{"role": "user", "content": "Who made the orrery?"}], "label": "x"}
    overrides = ["grpo.prompts_per_step=1", "grpo.samples_per_prompt=2", "rollout.retries=0"]
    config = load_local_config(None, overrides)
    run = RunContext(config, RunPaths(tmp_path), Console(file=io.StringIO()))
    closed = "http://127.0.0.1:9"
    with serve_in_thread(FakeSGLang([]).app()) as sglang:
        args = rollout_args(settings_for(config, sglang, (closed,), closed), tokenizer)
        rollouts = InProcessRollouts(engine=None, args={WORLD: args})
        with pytest.raises(RolloutAborted, match=r"^rollout 3: 2 of 2 episodes ABORTED") as error:
            grpo_step(run, 3, None, rollouts, [row], PromptSampler(1, 0))  # type: ignore[arg-type]
    assert "The limit is rollout.max_aborted_share." in str(error.value)


def refused_with(total: int, tokens: int) -> LocalSample:
    """An episode SGLang refused, its error as the rollout keeps it (`error_of`)."""
    said = TOO_LONG.replace("40123", str(total)).replace("39000", str(tokens))
    return LocalSample(
        status=SampleStatus.ABORTED,
        metadata={"deepdive": {"error": f"sglang: HTTP 400: {said}"}},
    )


def test_refusals_that_differ_only_in_their_numbers_read_as_one_line() -> None:
    """Eleven 400s with different token counts were eleven lines of one each (the top three
    shown): one line with its count now, the numbers that differ as their range."""
    samples = [refused_with(40_000 + i, 39_000 + 7 * i) for i in range(11)]
    samples.append(LocalSample(status=SampleStatus.ABORTED, metadata={"deepdive": {"error": "x"}}))
    args = make_args("http://127.0.0.1:9", {"tools": "http://t", "reward": "http://r"})
    with pytest.raises(RolloutAborted) as stopped:
        load_function(ROLLOUT_LOG_FUNCTION_PATH)(0, args, samples, {}, 1.0)
    said = str(stopped.value).split("SGLang said: ", 1)[1]
    assert said.startswith(
        "[11x] sglang: HTTP 400: Requested token count exceeds the model's maximum context "
        "length of 32768 tokens. You requested a total of 40000-40010 tokens: 39000-39070 "
        "tokens from the input messages and 1123 tokens for the completion."
    )
    assert "; [1x] x." in said


def test_most_said_keeps_apart_what_differs_in_words_and_names_few_values() -> None:
    errors = Counter(
        {"sglang: HTTP 503": 2, "sglang: HTTP 500": 1, "sglang aborted": 4, "serper: HTTP 429": 1}
    )
    assert most_said(errors) == (
        "[4x] sglang aborted; [3x] sglang: HTTP 500/503; [1x] serper: HTTP 429"
    )
    assert most_said(Counter()) == ""


# -- an episode that fills the context: TRUNCATED before SGLang's scheduler would abort it ---


async def fill_context(services: dict[str, str], context: int | None) -> LocalSample:
    """A search, then its answer, against a fake SGLang that keeps SGLang's bounds for
    `context` (fakes/sglang.py, `context_length`), the rollout told the same context."""
    fake = FakeSGLang([ScriptedTurn(SEARCH), ScriptedTurn(FINISH)], context_length=context)
    with serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, services, context=context or 100_000)
        args.deepdive_retries = 0
        sample: LocalSample = await generate_with_tool(
            args, new_sample(), {"max_new_tokens": 100_000}
        )
    return sample


@pytest.mark.anyio
@episode_test
@pytest.mark.parametrize(("room", "served"), [(3, False), (6, False), (7, True)])
async def test_an_input_sglang_would_abort_is_never_sent(
    services: dict[str, str], room: int, served: bool
) -> None:
    """SGLang's scheduler aborts inputs of context - 6 tokens and more (max_req_input_len =
    min(context - 1, pool - 1) - 5): an episode whose search leaves 3 (or 6) tokens of the
    context went on, was aborted and was kept out of training as SGLang's failure. It ends
    TRUNCATED at the context now; with 7 tokens left the next turn is served (and cut at the
    context: its answer is longer)."""
    played = await fill_context(services, None)
    assert played.status is SampleStatus.COMPLETED
    after_search = len(played.tokens) - len(FINISH)  # the input of the answer's turn
    sample = await fill_context(services, after_search + room)
    assert sample.status is SampleStatus.TRUNCATED, error_of(sample)
    stats = sample.metadata["deepdive"]
    assert (stats["turns"], stats["error"]) == ((2, "length") if served else (1, "context_limit"))
    assert not sample.remove_sample
