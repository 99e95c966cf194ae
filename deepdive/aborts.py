"""Aborted episodes: why they aborted, in SGLang's own words, and kept out of training.

An episode is ABORTED when SGLang refuses or fails a turn: a prompt longer than its context
(HTTP 400), sampling it cannot do (`--rollout-top-p` < 1 without slime's SGLang patch), an
engine that crashed or is unreachable, or slime aborting in-flight requests. What SGLang said
is what a person needs to fix it, so it is kept in the sample's error (`metadata["deepdive"]
["error"]`): the refused reply's message (SGLang answers `{"error": {"message": ...}}`,
python/sglang/srt/entrypoints/http_server.py; a router may answer text), or the abort's
`finish_reason.message`; on one line, capped, with every registered secret redacted.

An aborted episode is not a wrong answer: it must not train as one (`keep_out_of_training`).
"""

from __future__ import annotations

from typing import Any

import orjson

from services.exceptions import ServiceError, UpstreamBadResponse
from services.http import UpstreamReply
from services.logs import redact

MESSAGE_CHARS = 1000  # an error that echoes the whole prompt stays readable and small
_NOT_REFUSALS = frozenset({401, 402, 403, 429})  # the client's own rules: keys, rate limits


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """`text` on one line (whitespace runs as one space), at most `limit` characters, secrets
    redacted."""
    flat = " ".join(redact(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _words(value: Any) -> str | None:
    """The message in a decoded error body: SGLang's error.message, or a router's or a
    framework's message / detail / error text (a few levels deep at most: a body nested a
    thousand deep is read as text, never recursed into)."""
    for _ in range(4):
        if isinstance(value, str):
            return value
        if not isinstance(value, dict):
            return None
        value = next((value[key] for key in ("error", "message", "detail") if value.get(key)), None)
    return None


def sglang_message(content: bytes) -> str:
    """SGLang's own words in a refused reply's body: the message of its JSON error, else the
    body as text. Never raises, whatever the bytes."""
    try:
        decoded = orjson.loads(content)
    except orjson.JSONDecodeError:
        decoded = None
    found = _words(decoded)
    text = found if found is not None else content.decode("utf-8", errors="replace")
    return one_line(text) or "(no message)"


def sglang_refusal(reply: UpstreamReply) -> ServiceError | None:
    """The SGLang client's reading of a 4xx (services.http's `classify_error`): the request
    itself was refused, so retrying cannot help, and the error carries SGLang's message
    (the generic rule keeps only the status). Keys (401-403) and rate limits (429) keep the
    client's own rules; a 5xx is retried and named by its status."""
    status = reply.status_code
    if 400 <= status < 500 and status not in _NOT_REFUSALS:
        return UpstreamBadResponse("sglang", f"HTTP {status}: {sglang_message(reply.content)}")
    return None


def abort_reason(finish_reason: Any) -> str:
    """Why SGLang aborted a turn (its `finish_reason.message`, when it gave one)."""
    message = finish_reason.get("message") if isinstance(finish_reason, dict) else None
    return f"sglang aborted: {one_line(str(message))}" if message else "sglang aborted"


def keep_out_of_training(sample: Any) -> None:
    """An aborted episode is no answer: no token of it trains. slime zeroes the loss mask of a
    sample with `remove_sample` set (slime/ray/rollout.py, lines 680-681) and a zero mask adds
    nothing to the loss (slime/backends/megatron_utils/cp_utils.py, lines 73-81); the mask is
    zeroed here too, so the exclusion holds where `remove_sample` is not read (a custom
    --custom-convert-samples-to-train-data-path, the local trainer). Its reward, 0, still
    enters its group's mean (slime/utils/arguments.py, lines 1433-1437): deepdive.filters drops
    such a group when the over-sampled batch has one to spare."""
    sample.remove_sample = True
    sample.loss_mask = [0] * sample.response_length
