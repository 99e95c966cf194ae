"""deepdive.filters on groups of samples as slime passes them: a dynamic-sampling filter is
called `fn(args, group)` on each finished group and its answer read through slime's
`call_dynamic_filter` / `should_drop_dynamic_filter_output`
(slime/rollout/filter_hub/base_types.py, at 624b824); a buffer filter is called
`fn(args, rollout_id, buffer, num_samples)` (slime/rollout/data_source.py, lines 171-196)."""

from __future__ import annotations

from argparse import Namespace
from typing import Any

import pytest

from deepdive.filters import (
    drop_failed_groups,
    drop_uniform_groups,
    drop_uniform_or_failed_groups,
    pop_live_groups,
)
from deepdive.sample import LocalSample, SampleStatus


def sample(
    reward: Any, status: SampleStatus = SampleStatus.COMPLETED, error: str | None = None
) -> LocalSample:
    return LocalSample(reward=reward, status=status, metadata={"deepdive": {"error": error}})


def dropped(output: Any, remaining: int = 10, target: int = 4) -> bool:
    """slime's reading of a filter's answer (base_types.py: should_drop_dynamic_filter_output)."""
    if output.keep:
        return False
    return not (output.keep_when_insufficient and remaining <= target)


ARGS = Namespace(reward_key=None)


@pytest.mark.parametrize(
    ("rewards", "drop"),
    [
        ([1.0, 1.0, 1.0, 1.0], True),
        ([0.0, 0.0, 0.0, 0.0], True),
        ([0.0, 1.0, 0.0, 0.0], False),
        ([0.5, 0.5000001, 0.5, 0.5], True),
    ],
)
def test_a_group_that_scored_alike_teaches_nothing_and_is_dropped(
    rewards: list[float], drop: bool
) -> None:
    output = drop_uniform_groups(ARGS, [sample(r) for r in rewards])
    assert dropped(output) is drop
    assert (output.reason is not None) is drop  # slime counts drops by reason in its metrics


def test_rewards_under_a_reward_key_are_read_by_that_key() -> None:
    args = Namespace(reward_key="reward")
    group = [sample({"reward": 1.0}), sample({"reward": 0.0})]
    assert not dropped(drop_uniform_groups(args, group))
    assert dropped(drop_uniform_groups(args, [sample({"reward": 1.0})] * 2))


def test_a_group_where_every_sample_failed_is_dropped() -> None:
    failed = [
        sample(0.0, SampleStatus.ABORTED),
        sample(0.0, SampleStatus.FAILED, "malformed: no tool call"),
        sample(0.0, SampleStatus.TRUNCATED, "malformed: bad JSON"),  # continued, then ran out
    ]
    assert dropped(drop_failed_groups(ARGS, failed))
    assert drop_failed_groups(ARGS, failed[1:]).reason == "all_failed"
    one_honest = [*failed[1:], sample(0.0, SampleStatus.TRUNCATED, "max_turns")]
    assert not dropped(drop_failed_groups(ARGS, one_honest))


def test_both_filters_at_once() -> None:
    failed = [sample(0.0, SampleStatus.FAILED, "malformed: no tool call")] * 4
    assert dropped(drop_uniform_or_failed_groups(ARGS, failed))
    assert drop_uniform_or_failed_groups(ARGS, failed).reason == "all_failed"
    assert dropped(drop_uniform_or_failed_groups(ARGS, [sample(1.0)] * 4))
    assert not dropped(drop_uniform_or_failed_groups(ARGS, [sample(1.0), sample(0.0)]))


FILTERS = [drop_uniform_groups, drop_failed_groups, drop_uniform_or_failed_groups]


@pytest.mark.parametrize("dynamic_filter", FILTERS)
def test_a_group_with_an_aborted_sample_is_dropped_only_while_the_batch_has_one_to_spare(
    dynamic_filter: Any,
) -> None:
    """Its aborted sample trains no token, but its reward 0 sits in the group's mean
    (deepdive.aborts.keep_out_of_training): dropped when over-sampling has a group to spare,
    kept when dropping it would make slime sample another round."""
    group = [sample(1.0), sample(0.0), sample(0.0, SampleStatus.ABORTED)]
    output = dynamic_filter(ARGS, group)
    assert output.reason == "aborted"  # slime logs rollout/dynamic_filter/drop_aborted
    assert dropped(output, remaining=5, target=4)
    assert not dropped(output, remaining=4, target=4)


def slime_rollout(dynamic_filter: Any, group: list[LocalSample], target: int, over: int) -> int:
    """How many groups slime's rollout loop generates to fill `target` with a dynamic filter
    and --over-sampling-batch-size `over` (slime/rollout/sglang_rollout.py,
    `generate_rollout_async`, lines 400-442: a round of `over` groups whenever fewer than
    `target` are left in flight; a dropped group leaves, a kept one joins the data), every
    group coming back as `group`. Stops counting at 1,000: the rollout never ends."""
    data, remaining, generated = 0, 0, 0
    while data < target:
        while remaining < target:
            remaining += over
            generated += over
            if generated > 1000:
                return generated
        output = dynamic_filter(ARGS, group)
        keep_anyway = output.keep_when_insufficient and remaining <= target
        if not output.keep and not keep_anyway:
            remaining -= 1
            continue
        data += 1
    return generated


@pytest.mark.parametrize("dynamic_filter", FILTERS)
def test_sglang_refusing_every_request_cannot_make_the_rollout_sample_forever(
    dynamic_filter: Any,
) -> None:
    """Every group aborted: dropped for being failed or uniform, slime sampled round after
    round without end; the rollout now ends with what it has, and the run stops on its aborted
    share (deepdive.aborts.log_rollout)."""
    aborted = [sample(0.0, SampleStatus.ABORTED)] * 4
    assert slime_rollout(dynamic_filter, aborted, target=4, over=8) == 8
    assert slime_rollout(dynamic_filter, aborted, target=4, over=4) == 4
    assert slime_rollout(drop_uniform_groups, [sample(1.0)] * 4, 4, 8) > 1000  # DAPO's own


def test_the_buffer_filter_pops_live_groups_and_discards_dead_ones() -> None:
    dead = [sample(0.0, SampleStatus.ABORTED)] * 2
    live_a, live_b, live_c = ([sample(0.0), sample(1.0)] for _ in range(3))
    buffer = [dead, live_a, dead, live_b, live_c]
    taken = pop_live_groups(ARGS, 3, buffer, 2)
    assert taken == [live_a, live_b]
    assert buffer == [live_c]  # the dead groups before them left the buffer too
    assert pop_live_groups(ARGS, 3, [], 4) == []
