"""SGLang's top-p token replay, kept on a sample the way slime's trainer reads it.

With `--rollout-top-p` below 1 slime asks SGLang, per request, for the token ids each sampled
position kept (`sampling_params.custom_params.return_top_p_token_ids`), and its trainer
replays them: every sample must then carry `rollout_top_p_token_ids` and
`rollout_top_p_token_offsets` in CSR form, the kept ids of response token i being
`ids[offsets[i]:offsets[i + 1]]`, the offsets one longer than the response, starting at 0 and
ending at len(ids). Tokens the model did not sample (observations) keep an empty span.
slime checks exactly this when it turns samples into training data (slime/ray/rollout.py,
lines 718-732, at 624b824) and builds it so for its own generate (slime/utils/types.py,
`append_response_tokens` and `_apply_meta_info`, lines 253-349). SGLang sends each array as
base64 of native int32, as bytes or as a list (slime/utils/misc.py `decode_int32_meta_array`).

No torch here: the hook runs where the slime side loads no heavy library; plain lists are what
slime's checks take too.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from array import array
from dataclasses import dataclass, field
from typing import Any

ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def requested(sampling_params: dict[str, Any]) -> bool:
    """Whether slime asked SGLang for top-p token ids (it does when --rollout-top-p < 1)."""
    custom = sampling_params.get("custom_params")
    return isinstance(custom, dict) and bool(custom.get("return_top_p_token_ids"))


def _int32s(value: Any) -> list[int]:
    if isinstance(value, str):
        value = base64.b64decode(value.encode("ascii"), validate=True)
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        if len(raw) % 4:
            raise ValueError(f"{len(raw)} bytes are not whole int32 values")
        numbers = array("i")
        numbers.frombytes(raw)
        return numbers.tolist()
    if isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    ):
        return list(value)
    raise ValueError(f"expected base64, bytes or a list of integers, got {type(value).__name__}")


def _first(meta: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if meta.get(key) is not None:
            return meta[key]
    return None


def turn_spans(meta: dict[str, Any], tokens: int) -> tuple[list[int], list[int]]:
    """The kept ids and offsets SGLang returned for one turn of `tokens` sampled tokens; a
    ValueError saying what is wrong when they are missing or do not fit the turn."""
    raw_ids, raw_offsets = _first(meta, ID_KEYS), _first(meta, OFFSET_KEYS)
    if raw_ids is None or raw_offsets is None:
        raise ValueError("top-p token ids were asked for, but the reply has no ids and offsets")
    try:
        ids, offsets = _int32s(raw_ids), _int32s(raw_offsets)
    except (ValueError, binascii.Error, UnicodeEncodeError) as error:
        raise ValueError(f"top-p token data unreadable: {error}") from None
    if len(offsets) != tokens + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
        raise ValueError(
            f"top-p offsets do not fit the turn: {len(offsets)} offsets for {tokens} tokens, "
            f"first {offsets[:1]}, last {offsets[-1:]} for {len(ids)} ids"
        )
    if any(b < a for a, b in itertools.pairwise(offsets)):
        raise ValueError("top-p offsets go backwards")
    return ids, offsets


@dataclass
class TopPSpans:
    """The response's kept ids and offsets so far (offsets: one per response token, plus 1)."""

    ids: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=lambda: [0])

    def add_turn(self, ids: list[int], offsets: list[int]) -> None:
        base = self.offsets[-1]
        self.ids += ids
        self.offsets += [base + offset for offset in offsets[1:]]

    def add_empty(self, count: int) -> None:
        """`count` tokens the model did not sample (an observation): empty spans."""
        self.offsets += [self.offsets[-1]] * count
