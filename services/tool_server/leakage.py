"""Keep the answer out of the agent's reach: the leakage filter and the domain blocklist.

A training question must not be answerable by finding the question itself on the web (benchmark
mirrors, Q&A dumps). Texts are normalised to lowercase letters and digits, one word per CJK
character. A forbidden text of `ngram` words or more matches a document that shares any run of
`ngram` consecutive words with it; a shorter one matches when it appears as a whole-word phrase.

Normalisation also undoes what hides a text from a word-by-word comparison without changing what
a reader sees: HTML tags and character references, invisible characters (zero-width spaces, soft
hyphens) and Cyrillic or Greek letters standing in for Latin ones. Forbidden texts and documents
go through the same `normalize`, so whatever it does to one it does to the other.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from services.base.text import WORD

DEFAULT_NGRAM = 13


def _invisible_characters() -> list[str]:
    """Format characters (category Cf: soft hyphen, zero-width space/joiners, word joiner, BOM,
    bidi controls) and the other default-ignorable code points (variation selectors, combining
    grapheme joiner, Hangul fillers): none of them shows, so a document may hold them anywhere.
    Cf exists only in planes 0, 1 and 14; scanning those keeps the import cheap."""
    planes = (range(0x20000), range(0xE0000, 0xE1000))
    chars = [chr(c) for plane in planes for c in plane if unicodedata.category(chr(c)) == "Cf"]
    chars += ["\u034f", "\u115f", "\u1160", "\u17b4", "\u17b5", "\u3164", "\uffa0"]
    chars += [chr(c) for c in (*range(0x180B, 0x1810), *range(0xFE00, 0xFE10))]
    chars += [chr(c) for c in range(0xE0100, 0xE01F0)]
    return chars


def _char_class(chars: Iterable[str]) -> str:
    """A regex class of `chars` written as ranges, which the regex engine tests far faster than
    hundreds of single characters."""
    spans: list[list[int]] = []
    for code in sorted({ord(c) for c in chars}):
        if spans and spans[-1][1] == code - 1:
            spans[-1][1] = code
        else:
            spans.append([code, code])
    body = "".join(
        re.escape(chr(a)) + ("" if a == b else "-" + re.escape(chr(b))) for a, b in spans
    )
    return f"[{body}]"


# A class confined to the BMP is one table lookup per character; one that reaches beyond is a list
# of ranges tried in turn, so the few invisible characters past the BMP get their own pass, made
# only when the text has a character past the BMP at all.
_INVISIBLE = _invisible_characters()
_INVISIBLE_BMP = re.compile(_char_class(c for c in _INVISIBLE if c <= "\uffff") + "+")
_INVISIBLE_ASTRAL = re.compile(_char_class(c for c in _INVISIBLE if c > "\uffff") + "+")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")


def _remove_invisible(text: str) -> str:
    text = _INVISIBLE_BMP.sub("", text)
    return _INVISIBLE_ASTRAL.sub("", text) if _ASTRAL.search(text) else text


# Formatting that sits inside a line: `clock<i>maker</i>` reads "clockmaker", so these tags go
# without a trace. Every other known element (br, p, div, li, td, img...) separates words.
_INLINE_TAGS = frozenset(
    ("a", "abbr", "acronym", "b", "bdi", "bdo", "big", "cite", "code", "data", "del", "dfn", "em",
     "font", "i", "ins", "kbd", "mark", "nobr", "s", "samp", "small", "span", "strike", "strong",
     "sub", "sup", "time", "tt", "u", "var", "wbr")
)  # fmt: skip
_BLOCK_TAGS = frozenset(
    ("address", "area", "article", "aside", "audio", "base", "blockquote", "body", "br", "button",
     "canvas", "caption", "center", "col", "colgroup", "dd", "details", "dialog", "dir", "div",
     "dl", "dt", "embed", "fieldset", "figcaption", "figure", "footer", "form", "frame", "frameset",
     "h1", "h2", "h3", "h4", "h5", "h6", "head", "header", "hgroup", "hr", "html", "iframe", "img",
     "input", "label", "legend", "li", "link", "main", "map", "math", "menu", "meta", "meter",
     "nav", "noscript", "object", "ol", "optgroup", "option", "output", "p", "param", "picture",
     "pre", "progress", "q", "rp", "rt", "ruby", "script", "section", "select", "slot", "source",
     "style", "summary", "svg", "table", "tbody", "td", "template", "textarea", "tfoot", "th",
     "thead", "title", "tr", "track", "ul", "video")
)  # fmt: skip
# Only known element names count as tags, so prose such as "if x<y and y>z" stays as it is, and
# attributes are capped so that a stray "<b " cannot swallow a page up to some distant ">".
_TAG = re.compile(r"</?([A-Za-z][A-Za-z0-9]*)(?:[\s/][^<>]{0,1000})?>")
_CHARACTER_REFERENCE = re.compile(
    r"&(?:#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"
)


def _replace_tag(match: re.Match[str]) -> str:
    name = match[1].lower()
    if name in _INLINE_TAGS:
        return ""
    if name in _BLOCK_TAGS:
        return " "
    return match[0]


# Cyrillic and Greek letters drawn like Latin ones. Unicode's confusables.txt has thousands of
# entries and no maintained library for it is installed; these are the letters that pass for Latin
# in ordinary fonts. Each is folded together with its other case, so the fold never depends on case
# (capital and small EN both become h): where the two cases look like different Latin letters the
# small one decides (small NU looks like v, so capital NU, which looks like N, becomes V too).
_LOOKALIKES = {
    "a": "\N{CYRILLIC SMALL LETTER A}\N{GREEK SMALL LETTER ALPHA}",
    "b": "\N{CYRILLIC SMALL LETTER VE}\N{GREEK SMALL LETTER BETA}",
    "c": "\N{CYRILLIC SMALL LETTER ES}",
    "d": "\N{CYRILLIC SMALL LETTER KOMI DE}",
    "e": "\N{CYRILLIC SMALL LETTER IE}\N{GREEK SMALL LETTER EPSILON}",
    "h": "\N{CYRILLIC SMALL LETTER SHHA}\N{CYRILLIC SMALL LETTER EN}\N{GREEK SMALL LETTER ETA}",
    "i": "\N{CYRILLIC SMALL LETTER BYELORUSSIAN-UKRAINIAN I}\N{GREEK SMALL LETTER IOTA}",
    "j": "\N{CYRILLIC SMALL LETTER JE}\N{GREEK LETTER YOT}",
    "k": "\N{CYRILLIC SMALL LETTER KA}\N{GREEK SMALL LETTER KAPPA}",
    "l": "\N{CYRILLIC SMALL LETTER PALOCHKA}",
    "m": "\N{CYRILLIC SMALL LETTER EM}\N{GREEK SMALL LETTER MU}",
    "o": "\N{CYRILLIC SMALL LETTER O}\N{GREEK SMALL LETTER OMICRON}",
    "p": "\N{CYRILLIC SMALL LETTER ER}\N{GREEK SMALL LETTER RHO}",
    "q": "\N{CYRILLIC SMALL LETTER QA}",
    "s": "\N{CYRILLIC SMALL LETTER DZE}",
    "t": "\N{CYRILLIC SMALL LETTER TE}\N{GREEK SMALL LETTER TAU}",
    "u": "\N{GREEK SMALL LETTER UPSILON}",
    "v": "\N{GREEK SMALL LETTER NU}",
    "w": "\N{CYRILLIC SMALL LETTER WE}",
    "x": "\N{CYRILLIC SMALL LETTER HA}\N{GREEK SMALL LETTER CHI}",
    "y": "\N{CYRILLIC SMALL LETTER U}\N{CYRILLIC SMALL LETTER STRAIGHT U}",
    "z": "\N{GREEK SMALL LETTER ZETA}",
}
# Both cases go straight to the small Latin letter: casefolding comes next anyway.
_FOLD = str.maketrans(
    {letter: latin for latin, small in _LOOKALIKES.items() for letter in small + small.upper()}
)
_LOOKALIKE = re.compile(_char_class(chr(c) for c in _FOLD))
# The Greek and Cyrillic blocks and the combining ypogegrammeni (it casefolds to iota): no other
# NFKC character decomposes or casefolds to a look-alike.
_GREEK_OR_CYRILLIC = re.compile(
    "[\u0345\u0370-\u03ff\u0400-\u052f\u1c80-\u1c8f\u1d00-\u1dbf\u1f00-\u1fff\u2de0-\u2dff"
    "\ua640-\ua69f]"
)


def _fold_lookalikes(text: str) -> str:
    """Latin letters for look-alikes; searching first skips the slower translate for most text."""
    return text.translate(_FOLD) if _LOOKALIKE.search(text) else text


@dataclass(frozen=True)
class NormalizedText:
    """The words joined by single spaces, with a space at each end.

    One string rather than a tuple of words: a 9 MB page would otherwise be 1.5 million small
    objects held in the page cache. Words never contain a space, so a phrase " w1 w2 " found in
    `padded` is exactly a run of whole words.
    """

    padded: str

    @property
    def words(self) -> tuple[str, ...]:
        return tuple(self.padded.split())


def normalize(text: str) -> NormalizedText:
    """Lowercase words of `text` as a reader sees it; see the module docstring.

    For text free of markup, invisible characters and Cyrillic or Greek letters the words are the
    casefolded NFKC letters and digits they always were (question ids are hashed from them).
    """
    # Invisible characters, compatibility forms and look-alikes are all non-ASCII: isascii() is
    # O(1) and spares most text those passes.
    if not text.isascii():
        text = _remove_invisible(text)
    if "<" in text:
        text = _TAG.sub(_replace_tag, text)
    if "&" in text:
        text = _CHARACTER_REFERENCE.sub(lambda m: html.unescape(m[0]), text)
        if not text.isascii():
            text = _remove_invisible(text)
    if text.isascii():
        text = text.lower()
    else:
        text = unicodedata.normalize("NFKC", text)
        if _GREEK_OR_CYRILLIC.search(text):
            # NFKC is NFKD then composition; folding in between also catches a look-alike that
            # carries an accent (Cyrillic io is ie + diaeresis, so it becomes e + diaeresis).
            text = unicodedata.normalize("NFKD", text)
            text = unicodedata.normalize("NFC", _fold_lookalikes(text))
            # Casefolding can yield a look-alike again (Cyrillic narrow o casefolds to o).
            text = _fold_lookalikes(text.casefold())
        else:
            text = text.casefold()
    return NormalizedText(" " + " ".join(WORD.findall(text)) + " ")


class LeakageFilter:
    """Built once per request from its `forbidden_texts`; `matches` is called per result or page.

    Both a short text and each `ngram`-word run of a long one are kept as a padded phrase and
    searched for in the document's one string: C substring search, not a Python loop per word.
    """

    def __init__(self, forbidden_texts: Iterable[str], ngram: int = DEFAULT_NGRAM) -> None:
        self.ngram = ngram
        phrases: set[str] = set()
        for text in forbidden_texts:
            words = normalize(text).words
            if not words:
                continue
            if len(words) >= ngram:
                phrases.update(
                    " " + " ".join(words[i : i + ngram]) + " "
                    for i in range(len(words) - ngram + 1)
                )
            else:
                phrases.add(" " + " ".join(words) + " ")
        self._phrases = tuple(sorted(phrases))

    def __bool__(self) -> bool:
        return bool(self._phrases)

    def matches(self, text: NormalizedText) -> bool:
        padded = text.padded
        return any(phrase in padded for phrase in self._phrases)


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
