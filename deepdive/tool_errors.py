"""Tool errors: a rollout whose tools fail trains on nothing but error observations.

A compute node with no route out, a proxy the node was not told about, a search key out of
credit: every search and page read fails, the model reads "the tool server could not run
search" as its observations, and the run trains for days on rewards near 0 while nothing
stops it. Each episode counts its failed tool calls by kind (`RolloutStats.tool_errors`,
kinds in deepdive.protocol.TOOL_ERROR_KINDS, with what the tools said); each rollout's share
of failed calls goes to its metrics, and a rollout with more than `max_tool_error_share` of
its tool calls failed stops the run with the counts and the upstream's own words, as too many
aborted episodes do (deepdive.aborts). The model's own mistakes (a bad link id, a refused
URL) are no tool error and count nowhere.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from deepdive.messages import most_said
from deepdive.protocol import BROWSING_TOOLS, TOOL_ERROR_KINDS
from deepdive.rollout_settings import arg_name
from services.base.errors import RuntimeFailure
from services.base.logs import log_event

logger = logging.getLogger("deepdive.tool_errors")

TOOL_ERROR_CHARS = 300  # what an upstream said, per message: enough to name it, never a page

# what to check when a rollout's tools fail inside slime, and the setting
SLIME_TOOL_HINTS = (
    "Check the tool server's log (its upstreams' errors) and whether the compute nodes reach "
    "the search and page APIs (a proxy they need: HTTPS_PROXY; a key out of credit; a rate "
    "limit). The limit is slime.deepdive.max_tool_error_share."
)


class ToolsFailing(RuntimeFailure, RuntimeError):
    """More of a rollout's tool calls failed than `max_tool_error_share` allows: the search
    or page upstreams are failing, and training on their error observations would hide it."""


@dataclass
class ToolErrorCounts:
    """A rollout's tool calls (search, click, open), those that failed by kind, and what the
    tools said, by message."""

    calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    words: Counter[str] = field(default_factory=Counter)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    @property
    def share(self) -> float:
        return self.failed / self.calls if self.calls else 0.0

    def by_kind(self) -> str:
        return ", ".join(f"{kind} {count}" for kind, count in self.errors.most_common())


def _counter(value: Any) -> Counter[str]:
    """A {name: count} of an episode's statistics; anything else counts nothing."""
    found: Counter[str] = Counter()
    if isinstance(value, dict):
        for name, count in value.items():
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                found[str(name)] += count
    return found


def tool_error_counts(samples: Iterable[Any]) -> ToolErrorCounts:
    """The tool calls and tool errors of `samples` (their metadata["deepdive"])."""
    counts = ToolErrorCounts()
    for sample in samples:
        metadata = getattr(sample, "metadata", None)
        stats = metadata.get("deepdive") if isinstance(metadata, dict) else None
        if not isinstance(stats, dict):
            continue
        calls = _counter(stats.get("tool_calls"))
        counts.calls += sum(calls[name] for name in BROWSING_TOOLS)
        counts.errors += _counter(stats.get("tool_errors"))
        counts.words += _counter(stats.get("tool_error_words"))
    return counts


def tool_error_metrics(
    counts: ToolErrorCounts, prefix: str = "rollout/deepdive/"
) -> dict[str, Any]:
    """The rollout's tool calls, failed calls and their share, and the failures of each kind
    (every kind, 0 when none: a series that does not come and go)."""
    return {
        f"{prefix}tool_calls": counts.calls,
        f"{prefix}tool_errors": counts.failed,
        f"{prefix}tool_error_ratio": counts.share,
        **{f"{prefix}tool_errors/{kind}": counts.errors[kind] for kind in TOOL_ERROR_KINDS},
    }


def check_tool_error_share(
    samples: list[Any],
    limit: float,
    rollout_id: int,
    eval_set: str | None = None,
    hints: str = SLIME_TOOL_HINTS,
) -> ToolErrorCounts:
    """The tool calls and errors of `samples`; logged when any call failed. Raises
    ToolsFailing when the failed share is above `limit`, with the counts by kind and what
    the tools said, most often first, then `hints`: where to look, and the setting."""
    counts = tool_error_counts(samples)
    if not counts.failed:
        return counts
    log_event(
        logger,
        "rollout_tool_errors",
        logging.WARNING,
        rollout=rollout_id,
        eval_set=eval_set,
        failed=counts.failed,
        calls=counts.calls,
        share=round(counts.share, 4),
        kinds=counts.by_kind(),
    )
    if counts.share > limit:
        what = f"eval {eval_set} at rollout {rollout_id}" if eval_set else f"rollout {rollout_id}"
        raise ToolsFailing(
            f"{what}: {counts.failed} of {counts.calls} tool calls failed ({counts.share:.0%}), "
            f"more than {arg_name('max_tool_error_share')} = {limit:g} allows; the tools "
            f"failed, not the policy. By kind: {counts.by_kind()}. The tools said: "
            f"{most_said(counts.words) or '(nothing recorded)'}. {hints}"
        )
    return counts
