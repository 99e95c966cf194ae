"""Answer normalisation: how the rule judge decides that two short answers say the same thing.

Case, punctuation, whitespace and the articles a/an/the are ignored; numbers are compared as
numbers ("1,000" = "1000" = "1000.0"). The match is exact after that, so an answer that lists
several candidates ("Paris or Lyon") never matches a single reference.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
_NOT_WORD = re.compile(r"[^\w\s]|_")
_ARTICLES = frozenset({"a", "an", "the"})
_SEPARATORS = re.compile(r"\s*(?:;|/|\n|,|\bor\b|\band\b|&)\s*", re.IGNORECASE)


def _canonical_number(match: re.Match[str]) -> str:
    try:
        value = Decimal(match.group(0).replace(",", ""))
    except InvalidOperation:
        return match.group(0)
    text = format(value.normalize(), "f")
    return "0" if text in ("-0", "+0") else text.lstrip("+")


def normalize_answer(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold().strip()
    text = _NUMBER.sub(_canonical_number, text)
    text = _NOT_WORD.sub(lambda m: m.group(0) if m.group(0) in ".-" else " ", text)
    text = re.sub(r"(?<!\d)[.-]|[.-](?!\d)", " ", text)  # keep 3.5 and -2, drop other dots/dashes
    return " ".join(word for word in text.split() if word not in _ARTICLES)


def answers_match(answer: str, reference: str) -> bool:
    normalized = normalize_answer(answer)
    return bool(normalized) and normalized == normalize_answer(reference)


def candidates(answer: str) -> list[str]:
    """The parts of an answer that lists several (split on , ; / or and &), else []."""
    parts = [p for p in _SEPARATORS.split(answer) if normalize_answer(p)]
    return parts if len(parts) > 1 else []


def repeats_question(answer: str, question: str) -> bool:
    """True when the answer is the question, or quotes all of it (a reward hack)."""
    normalized_answer = normalize_answer(answer)
    normalized_question = normalize_answer(question)
    if not normalized_answer or not normalized_question:
        return False
    return normalized_answer == normalized_question or (
        len(normalized_question) >= 20 and normalized_question in normalized_answer
    )
