"""What a word is, for every comparison of texts: runs of letters and digits, and each CJK
character a word of its own (CJK text has no spaces between words).

The leakage filter matches forbidden texts in these words (after its own cleaning), and
`deepdive convert` hashes a question's plain words into its id.
"""

from __future__ import annotations

import re
import unicodedata

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
WORD = re.compile(rf"[{_CJK}]|[^\W_{_CJK}]+")


def plain_words(text: str) -> tuple[str, ...]:
    """The casefolded NFKC words of `text`, with no other cleaning: stable across releases, since
    question ids are made of them (the leakage filter's stronger normalisation may grow)."""
    return tuple(WORD.findall(unicodedata.normalize("NFKC", text).casefold()))
