"""The multi-turn rollout against real servers on loopback: a fake SGLang that plays scripted
turns, the real tool server on its offline provider, and the real reward server."""

from __future__ import annotations

from argparse import Namespace
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from deepdive.generate import generate_with_tool
from deepdive.protocol import format_observation, format_tool_call
from deepdive.reward import reward_func
from deepdive.sample import LocalSample, SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn, logprob_of
from services.serving.metrics import ServiceMetrics
from services.serving.serve import bind, start_server_thread
from services.tool_server.app import create_app as create_tool_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.tools import ToolExecutor
from tests.helpers import (
    PROMPT,
    TOKENIZER,
    make_args,
    new_sample,
    reward_app,
    serve_in_thread,
    tool_app,
)

# the rollout's pooled clients belong to each test's event loop: closed after each test
pytestmark = pytest.mark.usefixtures("rollout_clients")


def call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


async def rollout(
    script: list[ScriptedTurn], services: dict[str, str], evaluation: bool = False, **extra: Any
) -> tuple[LocalSample, FakeSGLang, Namespace]:
    fake = FakeSGLang(script)
    with serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, services, **extra)
        sample = await generate_with_tool(
            args, new_sample(), {"max_new_tokens": 4096, "temperature": 1.0}, evaluation=evaluation
        )
    return sample, fake, args


def expected_arrays(model_turns: list[str], response: str) -> tuple[list[int], list[float]]:
    """Mask and log-probs for a response made of these model turns, observations in between."""
    mask: list[int] = []
    logprobs: list[float] = []
    rest = response
    for turn in model_turns:
        head, found, tail = rest.partition(turn)
        assert found, f"turn {turn!r} not in the response"
        observation = TOKENIZER.encode(head)
        mask += [0] * len(observation)
        logprobs += [0.0] * len(observation)
        ids = TOKENIZER.encode(turn)
        mask += [1] * len(ids)
        logprobs += [logprob_of(i) for i in range(len(ids))]
        rest = tail
    assert rest == "" or rest.startswith("\n<observation>")
    tail_ids = TOKENIZER.encode(rest)
    return mask + [0] * len(tail_ids), logprobs + [0.0] * len(tail_ids)


@pytest.mark.anyio
async def test_a_three_tool_trajectory_that_finishes_earns_1(services: dict[str, str]) -> None:
    turns = [
        "Let me search.\n" + call("search", query="silver orrery Haldor"),
        call("click", link_id=1),
        call("open", url="https://wiki.example/Ilse_Varen"),
        "The orrery was built by Ilse Varen.\n" + call("finish", answer="Ilse Varen"),
    ]
    sample, fake, args = await rollout([ScriptedTurn(t) for t in turns], services)
    assert sample.status is SampleStatus.COMPLETED
    prompt_ids = TOKENIZER.encode(PROMPT)
    assert sample.tokens == prompt_ids + TOKENIZER.encode(sample.response)
    mask, logprobs = expected_arrays(turns, sample.response)
    assert sample.loss_mask == mask
    assert sample.rollout_log_probs == logprobs
    assert (
        sample.response_length == len(mask) == len(logprobs) == len(sample.tokens) - len(prompt_ids)
    )
    # the observations are the real tool server's answers, masked out
    assert "【1】Orrery of Haldor\nhttps://wiki.example/Orrery_of_Haldor" in sample.response
    assert "Title: Ilse Varen\nURL: https://wiki.example/Ilse_Varen" in sample.response
    assert sample.response.count("<observation>") == 3
    # token in: every turn sent exactly the ids so far, never re-tokenised text
    sent = [r["input_ids"] for r in fake.requests]
    assert sent[0] == prompt_ids and all(sent[k] == sample.tokens[: len(sent[k])] for k in range(4))
    assert [r["sampling_params"]["max_new_tokens"] for r in fake.requests] == [
        4096 - (len(s) - len(prompt_ids)) for s in sent
    ]
    assert all(
        r["sampling_params"]["stop"] == ["</tool_call>"] and r["return_logprob"]
        for r in fake.requests
    )
    assert (
        len({r["routing_key"] for r in fake.requests}) == 1
        and fake.requests[0]["routing_key"] == sample.session_id
    )
    assert sample.metadata["deepdive"]["tool_calls"] == {
        "search": 1,
        "click": 1,
        "open": 1,
        "finish": 1,
    }
    assert (
        sample.metadata["deepdive"]["turns"] == 4 and sample.metadata["deepdive"]["error"] is None
    )
    assert await reward_func(args, sample) == 1.0
    assert sample.metadata["reward_details"]["extracted_answer"] == "Ilse Varen"


@pytest.mark.anyio
async def test_a_malformed_call_fails_the_episode_by_default(services: dict[str, str]) -> None:
    sample, fake, args = await rollout(
        [
            ScriptedTurn('<tool_call>{"name": "search", "arguments": {</tool_call>'),
            ScriptedTurn("never sent"),
        ],
        services,
    )
    assert sample.status is SampleStatus.FAILED
    assert len(fake.requests) == 1 and "<observation>" not in sample.response
    assert sample.loss_mask == [1] * sample.response_length
    assert sample.metadata["deepdive"]["error"].startswith("malformed")
    assert await reward_func(args, sample) == 0.0


@pytest.mark.anyio
async def test_a_malformed_call_can_be_shown_to_the_model_instead(services: dict[str, str]) -> None:
    turns = ["<tool_call>not json</tool_call>", call("finish", answer="Ilse Varen")]
    sample, fake, args = await rollout(
        [ScriptedTurn(t) for t in turns], services, on_malformed="continue"
    )
    assert sample.status is SampleStatus.COMPLETED and len(fake.requests) == 2
    assert (
        format_observation(
            "Invalid tool call: the tool call is not valid JSON. Call exactly one of search, click, open or finish."
        )
        in sample.response
    )
    mask, _ = expected_arrays(turns, sample.response)
    assert sample.loss_mask == mask
    # the strict reward still refuses a trajectory with a malformed call in it
    assert await reward_func(args, sample) == 0.0


@pytest.mark.anyio
async def test_the_turn_limit_truncates(services: dict[str, str]) -> None:
    script = [ScriptedTurn(call("search", query=f"orrery {i}")) for i in range(5)]
    sample, fake, _ = await rollout(script, services, max_turns=2)
    assert sample.status is SampleStatus.TRUNCATED and len(fake.requests) == 2
    assert sample.metadata["deepdive"]["error"] == "max_turns"


@pytest.mark.anyio
async def test_the_context_limit_shrinks_each_turn_then_truncates(services: dict[str, str]) -> None:
    prompt_len = len(TOKENIZER.encode(PROMPT))
    context = prompt_len + 700
    script = [
        ScriptedTurn(call("search", query="silver orrery")),
        ScriptedTurn(call("open", url="https://wiki.example/Haldor")),
        ScriptedTurn("x" * 2000),
    ]
    sample, fake, _ = await rollout(script, services, context=context)
    assert sample.status is SampleStatus.TRUNCATED
    for request in fake.requests:
        assert request["sampling_params"]["max_new_tokens"] == context - len(request["input_ids"])
    assert len(sample.tokens) <= context
    assert sample.metadata["deepdive"]["error"] in {"length", "context_limit"}


@pytest.mark.anyio
async def test_tool_server_down_then_up(
    corpus_file: Path, tmp_path: Path, services: dict[str, str]
) -> None:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()  # nothing listens on this port yet
    stack = ExitStack()

    def start_tools_on_second_turn(count: int) -> None:
        if count == 2:  # the first search has failed by now; the server comes up for the second
            stack.callback(
                start_server_thread(tool_app(corpus_file, tmp_path), bind("127.0.0.1", port))
            )

    turns = [
        call("search", query="silver orrery"),
        call("search", query="silver orrery"),
        call("finish", answer="Ilse Varen"),
    ]
    fake = FakeSGLang([ScriptedTurn(t) for t in turns], on_request=start_tools_on_second_turn)
    with stack, serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, {**services, "tools": f"http://127.0.0.1:{port}"})
        sample = await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096})
    first, second = sample.response.split("<observation>")[1:3]
    assert "The tool server could not run search" in first
    assert "Orrery of Haldor" in second
    assert sample.status is SampleStatus.COMPLETED


@pytest.mark.anyio
async def test_an_abort_ends_with_a_defined_reward(services: dict[str, str]) -> None:
    sample, _fake, args = await rollout(
        [ScriptedTurn(call("search", query="x")), ScriptedTurn("", "abort")], services
    )
    assert sample.status is SampleStatus.ABORTED and sample.reward == 0.0
    assert (
        len(sample.loss_mask or []) == sample.response_length == len(sample.rollout_log_probs or [])
    )
    args.deepdive_reward_server_url = "http://127.0.0.1:9"  # never asked: aborted samples score 0
    assert await reward_func(args, sample) == 0.0


@pytest.mark.anyio
async def test_sglang_unreachable_is_an_abort_not_a_crash(services: dict[str, str]) -> None:
    args = make_args("http://127.0.0.1:9", services)
    sample = await generate_with_tool(args, new_sample(), {"max_new_tokens": 100})
    assert sample.status is SampleStatus.ABORTED and sample.reward == 0.0
    assert sample.metadata["deepdive"]["error"].startswith("sglang:")


@pytest.mark.anyio
async def test_evaluation_mode(services: dict[str, str]) -> None:
    sample, _, args = await rollout(
        [ScriptedTurn(call("finish", answer="I. Varen"))], services, evaluation=True
    )
    assert (
        sample.status is SampleStatus.COMPLETED
        and sample.metadata["deepdive"]["evaluation"] is True
    )
    assert await reward_func(args, sample) == 1.0  # an alias from the data's metadata


@pytest.mark.anyio
async def test_group_rewards_in_one_batch(services: dict[str, str]) -> None:
    samples = []
    for answer in ("Ilse Varen", "Vorn", "Haldor"):
        sample, _, args = await rollout([ScriptedTurn(call("finish", answer=answer))], services)
        samples.append(sample)
    assert await reward_func(args, samples) == [1.0, 0.0, 0.0]
    assert [s.metadata["reward_details"]["reward"] for s in samples] == [1, 0, 0]


@pytest.mark.anyio
async def test_an_unreachable_reward_server_scores_zero_without_raising(
    services: dict[str, str],
) -> None:
    sample, _, _args = await rollout([ScriptedTurn(call("finish", answer="Ilse Varen"))], services)
    args2 = make_args("http://127.0.0.1:9", {**services, "reward": "http://127.0.0.1:9"})
    assert await reward_func(args2, sample) == 0.0
    assert sample.metadata["reward_details"]["error"]["code"] == "upstream_unavailable"


@pytest.mark.anyio
@pytest.mark.parametrize(
    "script",
    [
        [call("search", query="silver orrery Haldor"), call("finish", answer="Ilse Varen")],
        [call("search", query="silver orrery Haldor"), "no call at all"],  # FAILED
        [call("search", query="silver orrery Haldor")] * 3,  # TRUNCATED at max_turns
    ],
)
async def test_an_episode_closes_its_tool_session_however_it_ends(
    corpus_file: Path, tmp_path: Path, script: list[str]
) -> None:
    # Sessions used to end only by expiry (an hour), holding each trajectory's last results.
    config = ToolServerConfig(corpus=corpus_file, index_cache_dir=tmp_path / "idx")
    metrics = ServiceMetrics("tool")
    search, reader = build_providers(config, metrics)
    executor = ToolExecutor(config, search, reader, metrics)
    with (
        serve_in_thread(create_tool_app(executor, metrics)) as tools,
        serve_in_thread(reward_app()) as reward,
    ):
        sample, _, _ = await rollout(
            [ScriptedTurn(t) for t in script], {"tools": tools, "reward": reward}, max_turns=3
        )
    assert sample.metadata["deepdive"]["tool_calls"]["search"] >= 1
    assert sample.session_id is not None
    assert executor.sessions.latest_results(sample.session_id) is None
    assert len(executor.sessions) == 0
