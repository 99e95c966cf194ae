"""slime's Sample when slime is installed, else a stand-in with the same fields and statuses.

The rollout only reads and writes Sample fields, so it runs inside slime's Ray actors and, on a
laptop, in the local trainer, with the same code. The stand-in mirrors slime at the commit the
project pins (THUDM/slime 624b824, slime/utils/types.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

try:  # pragma: no cover - exercised only where slime is installed (the GPU image)
    from slime.utils.types import Sample as SlimeSample
except ImportError:  # pragma: no cover - the CPU path
    SlimeSample = None


class SampleStatus(enum.Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class LocalSample:
    """The fields of slime's Sample that the rollout, the reward and the local trainer use."""

    Status = SampleStatus

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, str]] = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    status: SampleStatus = SampleStatus.PENDING
    metadata: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    # top-p replay in CSR form (slime/utils/types.py, lines 122-125; deepdive.top_p)
    rollout_top_p_token_ids: list[int] | None = None
    rollout_top_p_token_offsets: list[int] | None = None
    remove_sample: bool = False  # kept out of the loss (slime/utils/types.py, line 127)


Sample: Any = SlimeSample if SlimeSample is not None else LocalSample


def status_of(sample: Any, name: str) -> Any:
    """The member `name` of the sample's own Status enum (slime's or the stand-in's)."""
    enum_type = getattr(type(sample), "Status", SampleStatus)
    return enum_type[name]


def status_name(sample: Any) -> str:
    status = getattr(sample, "status", None)
    return str(getattr(status, "name", status))
