"""Whatever the model writes, the rollout and the reward hooks return: hostile turns from a fake
SGLang, through the real tool server and the real reward server on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deepdive.clients import close_clients
from deepdive.generate import generate_with_tool
from deepdive.protocol import FINISH, find_tool_calls, format_tool_call
from deepdive.reward import reward_func
from deepdive.sample import LocalSample, SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn
from services.reward_server.app import create_app as create_reward_app
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.reward_server.rule_judge import RuleJudge
from services.serving.metrics import ServiceMetrics
from tests import hostile
from tests.helpers import make_args, new_sample, serve_in_thread, tool_app

SUPERSCRIPT_CLICK = '<tool_call>{"name": "click", "arguments": {"link_id": "²"}}</tool_call>'
CORRECT = format_tool_call(FINISH, {"answer": "Ilse Varen"})
PARAMS = {"max_new_tokens": 4096, "temperature": 1.0}


def reward_app(**config: Any) -> Any:
    return create_reward_app(
        RewardServerConfig(**config), Evaluator(RuleJudge(), 10), ServiceMetrics("reward")
    )


@pytest.fixture
def tools(corpus_file: Path, tmp_path: Path) -> Iterator[str]:
    with serve_in_thread(tool_app(corpus_file, tmp_path)) as base:
        yield base


async def episode(
    script: list[str], tools: str, reward: str, **extra: Any
) -> tuple[LocalSample, Any]:
    fake = FakeSGLang([ScriptedTurn(text) for text in script])
    with serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, {"tools": tools, "reward": reward}, **extra)
        sample = await generate_with_tool(args, new_sample(), dict(PARAMS))
    return sample, args


@pytest.mark.anyio
async def test_an_odd_number_in_a_call_is_an_observation_not_a_crash(tools: str) -> None:
    # generate_with_tool raised ValueError on this turn, even with on_malformed = "continue".
    with serve_in_thread(reward_app()) as reward:
        sample, _ = await episode(
            [SUPERSCRIPT_CLICK, CORRECT], tools, reward, on_malformed="continue"
        )
        assert sample.status is SampleStatus.COMPLETED
        assert '"link_id" must be a whole number' in sample.response
        failed, _ = await episode([SUPERSCRIPT_CLICK], tools, reward)
        assert failed.status is SampleStatus.FAILED
    await close_clients()


@pytest.mark.anyio
@pytest.mark.parametrize("number", ["1e30", "123456789012345678901234567890", "1e19", "1e9"])
async def test_a_huge_number_in_a_call_is_an_invalid_argument_not_a_crash(
    tools: str, number: str
) -> None:
    # {"link_id": 1e30} became a 100-bit int that orjson could not encode for the tool
    # server: TypeError out of the rollout.
    call = f'<tool_call>{{"name": "click", "arguments": {{"link_id": {number}}}}}</tool_call>'
    with serve_in_thread(reward_app()) as reward:
        sample, _ = await episode(
            [format_tool_call("search", {"query": "orrery"}), call, CORRECT],
            tools,
            reward,
            on_malformed="continue",
        )
    assert sample.status is SampleStatus.COMPLETED
    assert '"link_id" must be' in sample.response
    await close_clients()


@given(number=st.integers(min_value=2**31) | st.floats(min_value=2**31, allow_infinity=False))
def test_no_number_parses_past_the_bound(number: float) -> None:
    text = '<tool_call>{"name": "click", "arguments": {"link_id": ' + f"{number}}}}}</tool_call>"
    for found in find_tool_calls(text):
        assert found.call is None and found.error is not None
        assert found.error.code in ("invalid_arguments", "invalid_json")


@pytest.mark.anyio
@pytest.mark.parametrize("config", [{}, {"max_batch": 2}])
async def test_one_odd_sample_never_zeroes_its_group(tools: str, config: dict[str, Any]) -> None:
    # The group of three correct samples plus one with "²" scored [0, 0, 0, 0]: the batch
    # answered 500. With max_batch = 2 the server refuses the batch itself (422), and the
    # hook asks for each sample on its own.
    with serve_in_thread(reward_app(**config)) as reward:
        group = []
        for turns in ([CORRECT], [CORRECT], [SUPERSCRIPT_CLICK, CORRECT], [CORRECT]):
            sample, args = await episode(turns, tools, reward, on_malformed="continue")
            group.append(sample)
        assert await reward_func(args, group) == [1.0, 1.0, 0.0, 1.0]
        details = group[2].metadata["reward_details"]
        assert details["format_ok"] is False and "tool call 1" in details["format_reason"]
    await close_clients()


@pytest.mark.slow
def test_no_model_output_raises_out_of_the_hooks(tools: str) -> None:
    """Arbitrary Unicode turns, odd numbers, odd URLs and half-written calls: every episode ends
    with consistent arrays and a defined status, and its group gets a reward for each sample."""
    with serve_in_thread(reward_app()) as reward:

        @settings(
            max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        @given(
            turns=st.lists(hostile.model_turns, min_size=1, max_size=4),
            finish=st.booleans(),
            on_malformed=st.sampled_from(["fail", "continue"]),
        )
        def check(turns: list[str], finish: bool, on_malformed: str) -> None:
            async def run() -> None:
                script = [*turns, CORRECT] if finish else turns
                sample, args = await episode(script, tools, reward, on_malformed=on_malformed)
                assert sample.status in set(SampleStatus) - {SampleStatus.PENDING}
                assert sample.loss_mask is not None and sample.rollout_log_probs is not None
                assert (
                    len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
                )
                response_ids = sample.tokens[len(sample.tokens) - sample.response_length :]
                assert response_ids == list(sample.response.encode("utf-8"))
                rewards = await reward_func(args, [sample, sample])
                assert rewards in ([0.0, 0.0], [1.0, 1.0])
                await close_clients()

            anyio.run(run)

        check()
