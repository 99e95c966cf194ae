"""The group normalisation slime loads as --custom-reward-post-process-path
(deepdive.group_rewards.post_process_rewards) against slime's own `_post_process_rewards`
(slime/ray/rollout.py, lines 608-633 at 624b824, transcribed below): equal, bit for bit, on
rollouts without an aborted episode, whatever the estimator and the normalisation flags; with
aborted episodes, slime's arithmetic over the answered ones of each group."""

from __future__ import annotations

import random
from argparse import Namespace
from collections.abc import Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from deepdive.local.grpo import group_advantages  # noqa: E402
from deepdive.rollout_settings import REWARD_POST_PROCESS_PATH  # noqa: E402
from deepdive.sample import LocalSample, SampleStatus  # noqa: E402
from tests.helpers import load_function  # noqa: E402


def slime_post_process_rewards(
    args: Namespace, samples: list[LocalSample]
) -> tuple[list[float], list[float]]:
    """slime's `RolloutManager._post_process_rewards` without a custom function
    (slime/ray/rollout.py, lines 612-633), over `get_reward_value` (slime/utils/types.py,
    lines 246-247)."""
    raw_rewards = [s.reward if not args.reward_key else s.reward[args.reward_key] for s in samples]  # type: ignore[index]
    if (
        args.advantage_estimator in ["grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"]
        and args.rewards_normalization
    ):
        rewards = torch.tensor(raw_rewards, dtype=torch.float)
        if rewards.shape[-1] == args.n_samples_per_prompt * args.rollout_batch_size:
            rewards = rewards.reshape(-1, args.n_samples_per_prompt)
        else:
            rewards = rewards.view(-1, rewards.shape[-1])
        mean = rewards.mean(dim=-1, keepdim=True)
        rewards = rewards - mean
        if args.advantage_estimator in ["grpo", "gspo", "cispo"] and args.grpo_std_normalization:
            std = rewards.std(dim=-1, keepdim=True)
            rewards = rewards / (std + 1e-6)
        return raw_rewards, rewards.flatten().tolist()  # type: ignore[return-value]
    return raw_rewards, raw_rewards  # type: ignore[return-value]


def slime_args(**changes: Any) -> Namespace:
    """slime's defaults for the flags the function reads (slime/utils/arguments.py, lines
    941-1015, and 1981-1983: n = 1 turns the std normalisation off)."""
    args = Namespace(
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        n_samples_per_prompt=4,
        rollout_batch_size=3,
        reward_key=None,
        custom_reward_post_process_path=REWARD_POST_PROCESS_PATH,
    )
    for key, value in changes.items():
        setattr(args, key, value)
    if args.n_samples_per_prompt == 1:
        args.grpo_std_normalization = False
    return args


def samples_of(
    rewards: Sequence[float],
    aborted: frozenset[int] | set[int] = frozenset(),
    key: str | None = None,
) -> list[LocalSample]:
    return [
        LocalSample(
            reward={key: reward} if key else reward,
            status=SampleStatus.ABORTED if i in aborted else SampleStatus.COMPLETED,
        )
        for i, reward in enumerate(rewards)
    ]


def slime_calls_the_hook(args: Namespace, samples: list[LocalSample]) -> Any:
    """slime/ray/rollout.py, lines 388-390 and 609-610: the function at the path, called
    with (args, samples)."""
    return load_function(args.custom_reward_post_process_path)(args, samples)


REWARDS = [1, 0, 0, 1, 0, 0, 0, 0, 0.5, 1, 1, 0.25]
VARIANTS = [
    {},
    {"advantage_estimator": "gspo"},
    {"advantage_estimator": "cispo"},
    {"advantage_estimator": "reinforce_plus_plus_baseline"},
    {"advantage_estimator": "reinforce_plus_plus"},
    {"advantage_estimator": "ppo"},
    {"rewards_normalization": False},  # --disable-rewards-normalization
    {"grpo_std_normalization": False},  # --disable-grpo-std-normalization
    {"n_samples_per_prompt": 2, "rollout_batch_size": 6},
    {"n_samples_per_prompt": 1, "rollout_batch_size": 12},
    {"rollout_batch_size": 4},  # 12 samples, not 4 x 4: uneven, one group
    {"reward_key": "reward"},
]


@pytest.mark.parametrize("changes", VARIANTS, ids=[str(v) or "defaults" for v in VARIANTS])
def test_without_aborts_the_hook_is_slimes_own_function(changes: dict[str, Any]) -> None:
    args = slime_args(**changes)
    samples = samples_of(REWARDS, key=args.reward_key)
    assert slime_calls_the_hook(args, samples) == slime_post_process_rewards(args, samples)


def test_the_hook_equals_slimes_on_random_groups_bit_for_bit() -> None:
    rng = random.Random(7)
    for _ in range(50):
        n, batch = rng.randint(2, 8), rng.randint(1, 6)
        rewards = [rng.choice([0.0, 1.0, rng.random()]) for _ in range(n * batch)]
        args = slime_args(n_samples_per_prompt=n, rollout_batch_size=batch)
        samples = samples_of(rewards)
        assert slime_calls_the_hook(args, samples) == slime_post_process_rewards(args, samples)


def test_an_aborted_episode_leaves_its_groups_mean_and_std() -> None:
    """The issue's group: [1, aborted, 0, 1] gave the others [0.866, -0.866, 0.866]
    (slime's, the aborted 0 in the mean and std); the answered three get [0.577, -1.155,
    0.577], slime's numbers for the group [1, 0, 1]."""
    args = slime_args(n_samples_per_prompt=4, rollout_batch_size=1)
    group = samples_of([1, 0, 0, 1], aborted={1})
    _, slimes = slime_post_process_rewards(args, group)
    assert [round(slimes[i], 3) for i in (0, 2, 3)] == [0.866, -0.866, 0.866]
    raw, ours = slime_calls_the_hook(args, group)
    assert raw == [1, 0, 0, 1]
    assert [round(value, 3) for value in ours] == [0.577, 0.0, -1.155, 0.577]
    three = slime_args(n_samples_per_prompt=3, rollout_batch_size=1)
    answered = samples_of([1, 0, 1])
    assert [ours[i] for i in (0, 2, 3)] == slime_post_process_rewards(three, answered)[1]


@pytest.mark.parametrize("changes", VARIANTS[:9], ids=[str(v) or "defaults" for v in VARIANTS[:9]])
def test_with_aborts_each_group_is_slimes_over_its_answered_episodes(
    changes: dict[str, Any],
) -> None:
    args = slime_args(**changes)
    n = args.n_samples_per_prompt
    aborted = {1, 4, 5, 8, 9}  # groups of 4: one, two, two and none aborted
    raw, ours = slime_calls_the_hook(args, samples_of(REWARDS, aborted))
    assert raw == REWARDS
    for start in range(0, len(REWARDS), n):
        kept = [i for i in range(start, start + n) if i not in aborted]
        alone = slime_args(
            **{**changes, "n_samples_per_prompt": len(kept), "rollout_batch_size": 1}
        )
        if len(kept) >= 2 or args.advantage_estimator in ("ppo", "reinforce_plus_plus"):
            expected = slime_post_process_rewards(alone, samples_of([REWARDS[i] for i in kept]))[1]
            assert [ours[i] for i in kept] == pytest.approx(expected, abs=1e-6)
        else:  # one answer left: nothing to compare it with
            assert [ours[i] for i in kept] == [0.0] * len(kept) or not args.rewards_normalization
        if (
            args.advantage_estimator not in ("ppo", "reinforce_plus_plus")
            and args.rewards_normalization
        ):
            assert all(ours[i] == 0.0 for i in range(start, start + n) if i in aborted)


def test_uneven_groups_are_one_group_of_the_answered() -> None:
    """slime's own rule for a rollout that is not n x rollout_batch_size samples (line 624):
    one group; over its answered episodes."""
    args = slime_args(n_samples_per_prompt=4, rollout_batch_size=2)  # 5 samples, not 8
    rewards = [1, 0, 1, 1, 0]
    _, ours = slime_calls_the_hook(args, samples_of(rewards, aborted={0}))
    alone = slime_args(n_samples_per_prompt=4, rollout_batch_size=1)
    assert ours[1:] == slime_post_process_rewards(alone, samples_of(rewards[1:]))[1]
    assert ours[0] == 0.0


def test_a_group_with_every_episode_aborted_trains_nothing() -> None:
    args = slime_args(n_samples_per_prompt=2, rollout_batch_size=2)
    _, ours = slime_calls_the_hook(args, samples_of([0, 0, 1, 0], aborted={0, 1}))
    assert ours[:2] == [0.0, 0.0] and ours[2:] == pytest.approx([0.7071, -0.7071], abs=1e-3)
    assert slime_calls_the_hook(args, []) == ([], [])


def test_the_local_trainer_does_the_same_arithmetic() -> None:
    """deepdive.local.grpo.group_advantages, the local backend's GRPO step, with the
    answered episodes marked (deepdive.local.training)."""
    answered = [True, False, True, True]
    advantages = group_advantages([1, 0, 0, 1], 4, answered=answered)
    assert [round(value, 3) for value in advantages] == [0.577, 0.0, -1.155, 0.577]
    args = slime_args(n_samples_per_prompt=4, rollout_batch_size=3)
    samples = samples_of(REWARDS, {1, 4, 5})
    answered = [s.status is not SampleStatus.ABORTED for s in samples]
    assert group_advantages(REWARDS, 4, answered=answered) == slime_calls_the_hook(args, samples)[1]
    assert group_advantages(REWARDS, 4) == slime_post_process_rewards(args, samples_of(REWARDS))[1]
