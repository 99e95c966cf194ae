"""What the agent did in a rollout, as numbers per step: tool calls per episode by tool, turns,
how episodes ended, the tools' errors by code, leakage blocks, tokens, and reward by number of
searches (DeepDive's analysis follows tool calls per trajectory rising with training).

Read from each sample's statistics (`metadata["deepdive"]`, deepdive.episode) and status, so
both backends compute the same numbers: slime through our rollout log function
(deepdive.aborts, under `rollout/deepdive/agent/`), the local backend in its step metrics
(under `agent/`); `deepdive status` shows the newest beside the reward.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from deepdive.protocol import FINISH, TOOL_NAMES
from deepdive.sample import status_name

SLIME_PREFIX = "rollout/deepdive/agent/"
LOCAL_PREFIX = "agent/"
CONTENT_BLOCKED = "content_blocked"  # the leakage filter or the blocklist refused a page
SEARCHES_BUCKETS = 4  # reward by searches: 0, 1, 2, 3 and 4_or_more
_STATUSES = ("COMPLETED", "TRUNCATED", "ABORTED", "FAILED")


def _stats(sample: Any) -> dict[str, Any]:
    metadata = getattr(sample, "metadata", None)
    found = metadata.get("deepdive") if isinstance(metadata, dict) else None
    return found if isinstance(found, dict) else {}


def _reward(sample: Any) -> float:
    reward = getattr(sample, "reward", None)
    if isinstance(reward, dict):  # --reward-key: every key holds the same number
        reward = next(iter(reward.values()), 0.0)
    return float(reward) if isinstance(reward, int | float) else 0.0


def _count(value: Any) -> int:
    return max(0, value) if isinstance(value, int) and not isinstance(value, bool) else 0


def agent_statistics(samples: list[Any], prefix: str = "") -> dict[str, float]:
    """The rollout's agent statistics, each key under `prefix` (empty: none yet for no sample).

    tool_calls/NAME     calls of each tool per episode (finish included); tool_calls: the
                        browsing calls (search, click, open) per episode
    turns               model turns per episode
    finish_rate, truncated_rate, aborted_rate, failed_rate: the share of episodes ending so
    malformed_rate      the share of calls that did not parse
    tool_errors/CODE    failed tool calls per episode by the tools' error code (the model's
                        mistakes and the infrastructure's; deepdive.tool_errors stops a run
                        on the latter)
    leakage_blocks      pages the leakage filter or the blocklist refused, per episode
    response_tokens     response tokens per episode (model_tokens: the model's own)
    reward_by_searches/N the mean reward of the episodes with N searches (4_or_more: four or
                        more; a TensorBoard tag holds no "+")
    """
    if not samples:
        return {}
    count = len(samples)
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    statuses = Counter(status_name(sample) for sample in samples)
    turns = response = model = 0
    by_searches: dict[str, list[float]] = {}
    for sample in samples:
        stats = _stats(sample)
        used = stats.get("tool_calls")
        used = used if isinstance(used, dict) else {}
        calls.update({str(k): _count(v) for k, v in used.items()})
        turns += _count(stats.get("turns"))
        log = stats.get("turn_log")
        for entry in log if isinstance(log, list) else []:
            code = entry.get("tool_error") if isinstance(entry, dict) else None
            if isinstance(code, str):
                errors[code] += 1
        length = _count(getattr(sample, "response_length", 0))
        response += length
        mask = getattr(sample, "loss_mask", None)
        model += sum(mask) if isinstance(mask, list) else 0
        searches = min(_count(used.get("search")), SEARCHES_BUCKETS)
        bucket = f"{searches}_or_more" if searches == SEARCHES_BUCKETS else str(searches)
        by_searches.setdefault(bucket, []).append(_reward(sample))
    made = sum(calls.values())
    result: dict[str, float] = {
        **{f"tool_calls/{name}": calls[name] / count for name in TOOL_NAMES},
        "tool_calls": sum(calls[name] for name in TOOL_NAMES if name != FINISH) / count,
        "turns": turns / count,
        "finish_rate": statuses["COMPLETED"] / count,
        "truncated_rate": statuses["TRUNCATED"] / count,
        "aborted_rate": statuses["ABORTED"] / count,
        "failed_rate": statuses["FAILED"] / count,
        "malformed_rate": calls["malformed"] / made if made else 0.0,
        **{f"tool_errors/{code}": n / count for code, n in sorted(errors.items())},
        "leakage_blocks": errors[CONTENT_BLOCKED] / count,
        "response_tokens": response / count,
        "model_tokens": model / count,
        **{
            f"reward_by_searches/{bucket}": sum(rewards) / len(rewards)
            for bucket, rewards in sorted(by_searches.items())
        },
    }
    return {prefix + key: value for key, value in result.items()}
