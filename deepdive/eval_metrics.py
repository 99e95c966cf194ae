"""An evaluation's accuracy over the episodes SGLang answered, with the aborted count beside it.

slime logs each evaluation set's accuracy as the mean reward of all its episodes
(slime/observability/rollout_metrics.py, `log_eval_rollout_data`, lines 229-245 at 624b824):
an ABORTED episode (SGLang refused or failed it: deepdive.aborts) scores 0 there, a wrong
answer it never gave: 2 of 11 aborted turned 4/9 into 4/11. When a set has aborted episodes,
slime's own logging is given the set's answered episodes (`answered_view`), so
`eval/NAME` and the per-sample metrics are over those, and `eval/NAME/aborted` and
`eval/NAME/episodes` say how many were left out of how many. Pass@k needs whole groups, so it
stays over every episode, an aborted one counted as not solved (`pass_at_k`, slime's
estimator, metric_utils.py lines 14-56).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from deepdive.sample import status_name


def answered_accuracy(rewards: Sequence[float], statuses: Sequence[str]) -> tuple[float, int]:
    """The mean reward of the episodes not ABORTED (0.0 when none was answered) and how many
    were aborted."""
    answered = [r for r, status in zip(rewards, statuses, strict=True) if status != "ABORTED"]
    aborted = len(rewards) - len(answered)
    return (sum(answered) / len(answered) if answered else 0.0), aborted


def pass_at_k(rewards: Sequence[float], group_size: int) -> dict[str, float]:
    """slime's pass@k of consecutive groups of `group_size` (k = 1, 2, 4, ... up to it; a
    reward of exactly 1 solves): the unbiased estimator 1 - C(n - c, k) / C(n, k), averaged
    over groups. Nothing for groups of one, as slime."""
    if group_size <= 1 or not rewards or len(rewards) % group_size:
        return {}
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    metrics = {}
    for power in range(int(math.log2(group_size)) + 1):
        k = 2**power
        estimates = []
        for group in groups:
            solved = sum(1 for reward in group if reward == 1)
            if group_size - solved < k:
                estimates.append(1.0)
            else:
                estimates.append(1.0 - math.comb(group_size - solved, k) / math.comb(group_size, k))
        metrics[f"pass@{k}"] = sum(estimates) / len(estimates)
    return metrics


def has_aborted(data: Any) -> bool:
    """Whether any evaluation set of slime's eval data has an ABORTED episode."""
    for result in (data or {}).values():
        samples = result.get("samples") if isinstance(result, dict) else None
        if any(status_name(sample) == "ABORTED" for sample in samples or []):
            return True
    return False


def answered_view(
    args: Any, data: dict[str, Any], extra: Any
) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """What slime's own eval logging is given instead of `data` and `extra`: each set's
    answered episodes (rewards, truncated flags, samples, aligned as slime aligns them), the
    aborted and total counts as metrics, pass@k over every episode; and `args` with slime's
    pass rate off (it needs whole groups) and our log function out of the way."""
    answered: dict[str, Any] = {}
    metrics: dict[str, Any] = dict(extra or {})
    group_size = int(getattr(args, "n_samples_per_eval_prompt", 1) or 1)
    for name, result in data.items():
        samples = list(result.get("samples") or [])
        rewards = list(result.get("rewards") or [])
        if len(samples) != len(rewards):  # not slime's shape: slime logs it as it is
            answered[name] = result
            continue
        keep = [i for i, sample in enumerate(samples) if status_name(sample) != "ABORTED"]
        view = {
            **result,
            "rewards": [rewards[i] for i in keep],
            "samples": [samples[i] for i in keep],
        }
        if isinstance(result.get("truncated"), list) and len(result["truncated"]) == len(samples):
            view["truncated"] = [result["truncated"][i] for i in keep]
        if not keep:  # slime divides by the count: an empty set reads as 0
            view = {"rewards": [0.0]}
        answered[name] = view
        metrics[f"eval/{name}/aborted"] = len(samples) - len(keep)
        metrics[f"eval/{name}/episodes"] = len(samples)
        if getattr(args, "log_passrate", False):
            metrics.update(
                {f"eval/{name}-{k}": v for k, v in pass_at_k(rewards, group_size).items()}
            )
    quiet = copy.copy(args)
    quiet.custom_eval_rollout_log_function_path = None
    quiet.log_passrate = False
    return answered, metrics, quiet
