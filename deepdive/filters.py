"""Group filters slime loads by path, for DeepDive-style training.

`--dynamic-sampling-filter-path deepdive.filters.drop_uniform_groups` (or `drop_failed_groups`,
or `drop_uniform_or_failed_groups`): slime calls `fn(args, samples)` on each finished group
and drops the group unless it keeps it (slime/rollout/sglang_rollout.py, lines 425-434,
through `call_dynamic_filter` and `should_drop_dynamic_filter_output`,
slime/rollout/filter_hub/base_types.py); with `--over-sampling-batch-size` above
`--rollout-batch-size` it samples more groups than it trains on, so dropped groups are
replaced.

- drop_uniform_groups: every sample scored alike, so every GRPO advantage is 0 and the group
  teaches nothing (DAPO's dynamic sampling);
- drop_failed_groups: every sample aborted (SGLang failed) or was malformed (FAILED, or ended
  on a malformed call): the group measures the infrastructure or the format, not the search.

Each of them first drops a group with an ABORTED sample, but only while the over-sampled batch
has a group to spare (`keep_when_insufficient`; slime counts the drops as
`rollout/dynamic_filter/drop_aborted`): the aborted sample trains no token
(deepdive.aborts) and its reward 0 is out of its group's mean (deepdive.group_rewards), yet
the group trains on fewer answers than its size. Never more than that: a group
dropped outright makes slime sample another round (lines 407-411), and with SGLang refusing
every request every group aborts, so the rollout sampled forever instead of ending and
stopping the run on its aborted share (deepdive.aborts.log_rollout).

`--buffer-filter-path deepdive.filters.pop_live_groups`: slime's buffer of groups handed back
for another try is read with `fn(args, rollout_id, buffer, num_samples)`
(slime/rollout/data_source.py, lines 171-196, default `pop_first`); this one pops the first
groups too, but drops those where every sample failed instead of trying them again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepdive.sample import status_name

try:  # pragma: no cover - where slime is installed (the training image)
    from slime.rollout.filter_hub.base_types import DynamicFilterOutput
except ImportError:  # pragma: no cover - the CPU path: the same fields

    @dataclass
    class DynamicFilterOutput:  # type: ignore[no-redef]
        keep: bool
        reason: str | None = None
        keep_when_insufficient: bool = False


def reward_value(args: Any, sample: Any) -> float:
    """The reward slime trains on (slime/utils/types.py, `get_reward_value`, lines 246-247);
    a reward that is not a number counts as 0."""
    reward = sample.reward
    key = getattr(args, "reward_key", None)
    if key and isinstance(reward, dict):
        reward = reward.get(key)
    try:
        return float(reward)
    except (TypeError, ValueError):
        return 0.0


def failed(sample: Any) -> bool:
    """Aborted, or FAILED (a malformed call under on_malformed = "fail"), or ended on a
    malformed call (the rollout's own record, metadata["deepdive"]["error"])."""
    if status_name(sample) in ("ABORTED", "FAILED"):
        return True
    error = ((sample.metadata or {}).get("deepdive") or {}).get("error") or ""
    return isinstance(error, str) and error.startswith("malformed")


def _aborted_group(samples: list[Any]) -> Any:
    """Dropped while the batch has a group to spare, kept (its aborted samples untrained)
    otherwise; None when no sample aborted."""
    if any(status_name(sample) == "ABORTED" for sample in samples):
        return DynamicFilterOutput(keep=False, reason="aborted", keep_when_insufficient=True)
    return None


def drop_uniform_groups(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    aborted = _aborted_group(samples)
    if aborted is not None:
        return aborted
    rewards = [reward_value(args, sample) for sample in samples]
    keep = max(rewards, default=0.0) - min(rewards, default=0.0) > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"uniform_{rewards[0]:g}")


def drop_failed_groups(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    aborted = _aborted_group(samples)
    if aborted is not None:
        return aborted
    keep = not samples or not all(failed(sample) for sample in samples)
    return DynamicFilterOutput(keep=keep, reason=None if keep else "all_failed")


def drop_uniform_or_failed_groups(args: Any, samples: list[Any], **kwargs: Any) -> Any:
    failure = drop_failed_groups(args, samples)
    return failure if not failure.keep else drop_uniform_groups(args, samples)


def pop_live_groups(
    args: Any, rollout_id: Any, buffer: list[list[Any]], num_samples: int
) -> list[list[Any]]:
    """The first `num_samples` groups of the buffer in which some sample did not fail; the
    failed ones before them leave the buffer too."""
    taken: list[list[Any]] = []
    while buffer and len(taken) < num_samples:
        group = buffer.pop(0)
        if not all(failed(sample) for sample in group):
            taken.append(group)
    return taken
