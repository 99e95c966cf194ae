"""The hooks as slime's own code reads them, at the pinned commit (THUDM/slime 624b824): what
slime checks or looks up on the samples and rewards our hooks return, for the flags the
default-flag runs did not cover (--rollout-top-p < 1, --reward-key, --partial-rollout and
the fully-async rollout). slime is not installable here; each test names the lines it pins."""

from __future__ import annotations

import statistics
from argparse import Namespace
from typing import Any

import pytest

from deepdive.generate import generate_with_tool
from deepdive.protocol import format_tool_call
from deepdive.reward import reward_func
from deepdive.sample import LocalSample, SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn, kept_ids
from services.base.errors import ConfigError
from tests.helpers import (
    PROMPT,
    TOKENIZER,
    make_args,
    new_sample,
    serve_in_thread,
)

TOP_P = {"max_new_tokens": 4096, "top_p": 0.9, "custom_params": {"return_top_p_token_ids": True}}


# the rollout's pooled clients belong to each test's event loop: closed after each test
pytestmark = pytest.mark.usefixtures("rollout_clients")


TURNS = [
    format_tool_call("search", {"query": "silver orrery Haldor"}),
    format_tool_call("click", {"link_id": 1}),
    "It was Ilse Varen.\n" + format_tool_call("finish", {"answer": "Ilse Varen"}),
]


async def play(
    services: dict[str, str], params: dict[str, Any], top_p_format: str = "base64", **extra: Any
) -> tuple[LocalSample, Namespace]:
    fake = FakeSGLang([ScriptedTurn(turn) for turn in TURNS], top_p_format=top_p_format)
    with serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, services)
        for key, value in extra.items():
            setattr(args, key, value)
        sample = await generate_with_tool(args, new_sample(), dict(params))
    return sample, args


def slime_top_p_check(sample: LocalSample) -> None:
    """What slime asserts before it trains on a sample with --rollout-top-p < 1
    (slime/ray/rollout.py, lines 718-730), and the length rule its own Sample keeps
    (slime/utils/types.py, `_validate_response_metadata_lengths`, lines 420-444)."""
    assert sample.rollout_top_p_token_ids is not None
    assert sample.rollout_top_p_token_offsets is not None
    assert len(sample.rollout_top_p_token_offsets) == sample.response_length + 1
    assert int(sample.rollout_top_p_token_offsets[-1]) == len(sample.rollout_top_p_token_ids)
    assert sample.rollout_top_p_token_offsets[0] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("top_p_format", ["base64", "list"])
async def test_top_p_below_1_keeps_each_turns_kept_ids_and_empty_spans_for_observations(
    services: dict[str, str], top_p_format: str
) -> None:
    """slime asks SGLang for the kept token ids (slime/rollout/sglang_rollout.py, lines 106-107)
    and replays them in training: the hook must store them per model turn, in CSR form, with
    empty spans for the observation tokens (as slime's own `append_response_tokens` does for
    non-trainable tokens, slime/utils/types.py, lines 304-349)."""
    sample, _ = await play(services, TOP_P, top_p_format)
    assert sample.status is SampleStatus.COMPLETED
    slime_top_p_check(sample)
    ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
    assert ids is not None and offsets is not None
    response = sample.tokens[len(TOKENIZER.encode(PROMPT)) :]
    position = 0  # the token's place inside its own model turn (the fake's kept ids follow it)
    for i, (token, mask) in enumerate(zip(response, sample.loss_mask or [], strict=True)):
        span = ids[offsets[i] : offsets[i + 1]]
        if mask:
            assert span == kept_ids(token, position), i
            position += 1
        else:
            assert span == [], i  # an observation token: nothing was sampled there
            position = 0


@pytest.mark.anyio
async def test_without_top_p_no_replay_data_is_stored(services: dict[str, str]) -> None:
    """At --rollout-top-p 1 slime neither asks nor reads (slime/ray/rollout.py, line 718)."""
    sample, _ = await play(services, {"max_new_tokens": 4096})
    assert sample.status is SampleStatus.COMPLETED
    assert sample.rollout_top_p_token_ids is None and sample.rollout_top_p_token_offsets is None


@pytest.mark.anyio
async def test_a_reply_without_the_asked_top_p_data_aborts_the_sample_not_the_rollout(
    services: dict[str, str],
) -> None:
    sample, _ = await play(services, TOP_P, top_p_format="missing")
    assert sample.status is SampleStatus.ABORTED
    assert "top-p" in sample.metadata["deepdive"]["error"]
    slime_top_p_check(sample)  # still consistent: an aborted turn adds no token


def slime_reward_value(args: Namespace, sample: LocalSample) -> Any:
    """How slime reads a sample's reward for training (slime/utils/types.py, lines 246-247)."""
    return sample.reward if not args.reward_key else sample.reward[args.reward_key]  # type: ignore[index]


def slime_eval_reward(args: Namespace, sample: LocalSample) -> Any:
    """...and for evaluation (slime/rollout/sglang_rollout.py, lines 617-620)."""
    key = args.eval_reward_key or args.reward_key
    return sample.reward if not key else sample.reward[key]  # type: ignore[index]


@pytest.mark.anyio
@pytest.mark.parametrize(("reward_key", "eval_reward_key"), [("reward", None), ("reward", "acc")])
async def test_with_a_reward_key_every_reward_is_a_dict_slime_can_index(
    services: dict[str, str], reward_key: str, eval_reward_key: str | None
) -> None:
    """`--rm-type remote_rm --reward-key reward`: an aborted sample used to carry 0.0 and slime's
    lookup `0.0["reward"]` raised a TypeError out of the training step."""
    fake = FakeSGLang([ScriptedTurn(TURNS[0]), ScriptedTurn("", "abort")])
    with serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, services)
        args.reward_key, args.eval_reward_key = reward_key, eval_reward_key
        aborted = await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096})
    assert aborted.status is SampleStatus.ABORTED
    assert slime_reward_value(args, aborted) == 0.0 and slime_eval_reward(args, aborted) == 0.0
    finished, _ = await play(services, {"max_new_tokens": 4096})
    finished.reward = await reward_func(args, finished)
    assert slime_reward_value(args, finished) == 1.0 and slime_eval_reward(args, finished) == 1.0
    plain = make_args("http://127.0.0.1:9", services)  # no key: a number, as before
    plain.reward_key = plain.eval_reward_key = None
    assert await reward_func(plain, finished) == 1.0


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("partial_rollout", True, "--partial-rollout"),
        (
            "rollout_function_path",
            "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
            "--rollout-function-path",
        ),
    ],
)
async def test_modes_that_continue_aborted_episodes_are_refused_naming_the_flag(
    services: dict[str, str], flag: str, value: Any, named: str
) -> None:
    """Both hand an aborted sample back to the hook and keep the reward it has
    (slime/rollout/sglang_rollout.py, `abort` lines 355-370 and `generate_and_rm` line 282;
    slime/rollout/fully_async_rollout.py, lines 19-23): four correct episodes came back with
    reward 0.0. A configuration error, before any episode."""
    args = make_args("http://127.0.0.1:9", services)
    setattr(args, flag, value)
    with pytest.raises(ConfigError, match=named):
        await generate_with_tool(args, new_sample(), {"max_new_tokens": 16})


def slime_loss_masks(samples: list[LocalSample]) -> list[list[int]]:
    """The loss masks slime trains with (slime/ray/rollout.py, `_convert_samples_to_train_data`,
    lines 671-683): the sample's own, or all ones; zeros where `remove_sample` is set."""
    masks = []
    for sample in samples:
        mask = sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length
        assert len(mask) == sample.response_length
        masks.append([0] * sample.response_length if sample.remove_sample else list(mask))
    return masks


def slime_grpo_advantages(args: Namespace, group: list[LocalSample]) -> list[float]:
    """slime's GRPO rewards for one group (slime/ray/rollout.py, `_post_process_rewards`,
    lines 612-631, with rewards and std normalisation on, its defaults): every sample's reward,
    aborted ones included, in the group's mean and std."""
    rewards = [float(slime_reward_value(args, sample)) for sample in group]
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [(reward - mean) / (std + 1e-6) for reward in rewards]


@pytest.mark.anyio
async def test_an_aborted_episode_trains_no_token(services: dict[str, str]) -> None:
    """A group of four: a correct answer, a wrong one, and two episodes SGLang refused after a
    search. Each sample's push on the policy is its advantage times its masked tokens (the
    per-sample masked sum, slime/backends/megatron_utils/cp_utils.py, lines 73-81): the
    refused episodes used to carry advantage -0.5 on their search turn, trained as wrong
    answers. Now their masks are zero: no gradient, whatever their advantage."""
    refused = [ScriptedTurn(TURNS[0]), ScriptedTurn("", status=400, message="too long")]
    finish = "Ilse Varen.\n" + format_tool_call("finish", {"answer": "Ilse Varen"})
    wrong = format_tool_call("finish", {"answer": "Vorn"})
    group = []
    for script in ([ScriptedTurn(finish)], [ScriptedTurn(wrong)], refused, refused):
        fake = FakeSGLang(list(script))
        with serve_in_thread(fake.app()) as sglang:
            args = make_args(sglang, services)
            group.append(await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096}))
    args.reward_key = None
    for sample, reward in zip(group[:2], await reward_func(args, group[:2]), strict=True):
        sample.reward = reward  # slime asks the RM only for the samples not aborted
    assert [s.status for s in group[2:]] == [SampleStatus.ABORTED] * 2
    masks = slime_loss_masks(group)
    pushes = [a * sum(m) for a, m in zip(slime_grpo_advantages(args, group), masks, strict=True)]
    assert pushes[0] > 0 and pushes[1] < 0  # the answers train as before
    assert pushes[2:] == [0.0, 0.0] and masks[2] == [0] * group[2].response_length
    assert group[2].response_length > 0  # the search turn is still in the sample, untrained
