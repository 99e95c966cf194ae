"""slime's Sample when slime is installed, else a stand-in with the same fields and statuses,
and what both hooks (deepdive.generate, deepdive.reward) read and write of a sample alike.

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


def forbidden_texts(sample: Any) -> tuple[str, ...]:
    """The texts the tool server's leakage filter and the reward's question come from (the
    row's metadata.remote_env_info.forbidden_texts, as `deepdive convert` writes it); a value
    of another shape is sent as it is, for the servers to refuse by name."""
    env = (sample.metadata or {}).get("remote_env_info") or {}
    texts = env.get("forbidden_texts") if isinstance(env, dict) else None
    if not texts:
        return ()
    return tuple(texts) if isinstance(texts, list | tuple) else (texts,)


def reward_shaped(args: Any, value: float) -> Any:
    """A reward in the shape slime reads it: the number, or, with --reward-key (and
    --eval-reward-key), a dict holding it under each key, since slime then looks it up by key
    (slime/utils/types.py, `get_reward_value`, lines 246-247; slime/rollout/sglang_rollout.py,
    lines 617-620, for evaluation)."""
    keys = {getattr(args, name, None) for name in ("reward_key", "eval_reward_key")}
    named = sorted(key for key in keys if isinstance(key, str) and key)
    return {key: value for key in named} if named else value
