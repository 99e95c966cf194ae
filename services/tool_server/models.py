"""The values that flow through the tool server: search results, pages (the request and the
reply are deepdive.protocol's envelopes)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property

from services.tool_server.leakage import NormalizedText, normalize


@dataclass(frozen=True)
class SearchResult:
    title: str
    url: str
    snippet: str

    @cached_property
    def normalized(self) -> NormalizedText:
        return normalize(f"{self.title}\n{self.url}\n{self.snippet}")


@dataclass(frozen=True)
class Page:
    """A whole page as text, as a reader returns it."""

    url: str
    title: str
    text: str


@dataclass(frozen=True)
class PreparedPage:
    """A page as the tool server keeps it: cut to `max_page_chars`, split into the model's pages
    and normalised for the leakage filter once, when it is fetched. Re-opening a cached page
    then costs a substring search and a slice, never a re-split of the whole text on the loop.
    """

    url: str
    title: str
    pieces: tuple[str, ...]
    normalized: NormalizedText
    cut_at: int | None = None  # the text was cut at this many characters

    @property
    def nbytes(self) -> int:
        """Memory held, as the page cache charges it."""
        strings = (self.url, self.title, self.normalized.padded, *self.pieces)
        return sys.getsizeof(self.pieces) + sum(sys.getsizeof(text) for text in strings)


# What a SearchResult costs besides its text, measured with sys.getsizeof on 3.11: the object
# and its __dict__ (~400 bytes), four str headers (~50-80 bytes each), the normalised text's
# object (~100 bytes). Rounded up.
_RESULT_OVERHEAD_BYTES = 1024


def results_nbytes(results: tuple[SearchResult, ...]) -> int:
    """Memory a cached result list may hold, the normalised form the leakage filter builds on
    its first filtered read included, estimated from the text lengths rather than measured
    (measuring meant building that form for every result, filtered or not, and ~10 % of a
    call's CPU). Bounded above: ASCII text takes a byte a character and normalises to at most
    its own length; other text at most 4 bytes a character, normalised to at most twice as
    many characters (a space after each CJK character)."""
    total = sys.getsizeof(results) + len(results) * _RESULT_OVERHEAD_BYTES
    for r in results:
        chars = len(r.title) + len(r.url) + len(r.snippet)
        plain = r.title.isascii() and r.url.isascii() and r.snippet.isascii()
        total += chars * (2 if plain else 12)
    return total
