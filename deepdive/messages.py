"""What an upstream said, as a person reads it in a stop message: each message on one line,
bounded, secrets redacted (`one_line`), and the most frequent of many (`most_said`).

A rollout that stops names what SGLang or the tools said. Their messages carry numbers that
differ from episode to episode (SGLang's "You requested a total of 40123 tokens" has a new
count in every refused episode), so messages are grouped by their text with the numbers taken
out: eleven refusals read as one line with its count, a number that differs written as its
values (up to three: `500/503`) or its range, one that does not as it is.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from services.base.logs import redact

MESSAGE_CHARS = 1000  # an error that echoes the whole prompt stays readable and small
_NUMBER = re.compile(r"\d+")


def one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """`text` on one line (whitespace runs as one space), at most `limit` characters, secrets
    redacted."""
    flat = " ".join(redact(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _shape(message: str) -> str:
    """The message with every number taken out: what messages are grouped by."""
    return _NUMBER.sub("#", message)


def _merged(messages: Iterable[str]) -> str:
    """One line for messages of one shape: each number that differs between them as its values
    (up to three) or its range, smallest first; each that does not as it is."""
    texts = list(messages)
    parts = [_NUMBER.split(text) for text in texts]
    numbers = [_NUMBER.findall(text) for text in texts]
    line = parts[0][0]
    for position in range(len(numbers[0])):
        seen = sorted({int(found[position]) for found in numbers})
        value = "/".join(map(str, seen)) if len(seen) <= 3 else f"{seen[0]}-{seen[-1]}"
        line += value + parts[0][position + 1]
    return line


def most_said(said: Counter[str], top: int = 3) -> str:
    """The `top` messages most often said, most often first, each with its count; messages
    that differ only in their numbers are one (`[11x] ... a total of 40123-41002 tokens`)."""
    groups: dict[str, Counter[str]] = {}
    for message, count in said.items():
        groups.setdefault(_shape(message), Counter())[message] += count
    ranked = sorted(groups.values(), key=lambda group: -sum(group.values()))
    return "; ".join(f"[{sum(group.values())}x] {_merged(group)}" for group in ranked[:top])
