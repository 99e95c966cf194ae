"""Keep the answer out of the agent's reach: the leakage filter and the domain blocklist.

A training question must not be answerable by finding the question itself on the web (benchmark
mirrors, Q&A dumps). Texts are normalised to lowercase letters and digits, one word per CJK
character. A forbidden text of `ngram` words or more matches a document that shares any run of
`ngram` consecutive words with it; a shorter one matches when it appears as a whole-word phrase.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_WORD = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+")

DEFAULT_NGRAM = 13


@dataclass(frozen=True)
class NormalizedText:
    words: tuple[str, ...]

    @property
    def padded(self) -> str:
        """Words joined by single spaces, with a space at each end, for whole-phrase search."""
        return " " + " ".join(self.words) + " "


def normalize(text: str) -> NormalizedText:
    return NormalizedText(tuple(_WORD.findall(unicodedata.normalize("NFKC", text).casefold())))


class LeakageFilter:
    """Built once per request from its `forbidden_texts`; `matches` is called per result or page."""

    def __init__(self, forbidden_texts: Iterable[str], ngram: int = DEFAULT_NGRAM) -> None:
        self.ngram = ngram
        self._phrases: list[str] = []
        self._ngrams: set[tuple[str, ...]] = set()
        for text in forbidden_texts:
            words = normalize(text).words
            if not words:
                continue
            if len(words) >= ngram:
                self._ngrams.update(_ngrams(words, ngram))
            else:
                self._phrases.append(" " + " ".join(words) + " ")

    def __bool__(self) -> bool:
        return bool(self._phrases or self._ngrams)

    def matches(self, text: NormalizedText) -> bool:
        if self._phrases:
            padded = text.padded
            if any(phrase in padded for phrase in self._phrases):
                return True
        if self._ngrams:
            return any(gram in self._ngrams for gram in _ngrams(text.words, self.ngram))
        return False


def _ngrams(words: tuple[str, ...], n: int) -> Iterable[tuple[str, ...]]:
    return (words[i : i + n] for i in range(len(words) - n + 1))


class DomainBlocklist:
    """Refuse a URL whose host is a listed domain or a subdomain of one."""

    def __init__(self, domains: Iterable[str]) -> None:
        self.domains = tuple(
            sorted({d.strip().lower().lstrip("*.").rstrip(".") for d in domains} - {""})
        )

    def blocks(self, url: str) -> bool:
        if not self.domains:
            return False
        try:
            host = (urlsplit(url).hostname or "").rstrip(".")
        except ValueError:
            return False
        return any(host == d or host.endswith("." + d) for d in self.domains)
