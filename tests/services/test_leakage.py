"""The leakage filter: what it matches, what cannot hide a text from it, and its old semantics."""

from __future__ import annotations

import dataclasses
import re
import unicodedata

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from services.tool_server.leakage import DomainBlocklist, LeakageFilter, NormalizedText, normalize
from tests import hostile

QUESTION = (
    "Which reclusive clockmaker from the valley of Vorn built the silver orrery that was "
    "later stolen from the museum in Haldor?"
)


def test_normalize_lowercases_and_drops_punctuation() -> None:
    assert normalize("Hello, WORLD!  It's 3.14").words == ("hello", "world", "it", "s", "3", "14")


def test_normalize_splits_cjk_into_characters_and_keeps_accents() -> None:
    assert normalize("Café 北京大学 ok").words == ("café", "北", "京", "大", "学", "ok")


def test_normalize_folds_fullwidth_forms() -> None:
    assert normalize("\uff21\uff22\uff23\uff11\uff12\uff13").words == ("abc123",)  # ＡＢＣ１２３  # noqa: RUF003


def test_long_forbidden_text_matches_by_13_gram_overlap() -> None:
    leak = LeakageFilter([QUESTION])
    words = QUESTION.split()
    thirteen = " ".join(words[3:16])
    twelve = " ".join(words[3:15])
    assert leak.matches(normalize(f"Trivia dump: {thirteen.upper()} ... and more"))
    assert not leak.matches(normalize(f"Trivia dump: {twelve} ... and more"))


def test_short_forbidden_text_matches_as_whole_phrase_only() -> None:
    leak = LeakageFilter(["Ilse Varen"])
    assert leak.matches(normalize("Built by ILSE   varen, in Vorn."))
    assert not leak.matches(normalize("Built by Ilse Varenko."))
    assert not leak.matches(normalize("Varen, Ilse"))


def test_cjk_forbidden_text_matches() -> None:
    leak = LeakageFilter(["北京大学"])
    assert leak.matches(normalize("他在北京大学读书"))
    assert not leak.matches(normalize("他在北京读书"))


def test_empty_filter_is_falsy_and_matches_nothing() -> None:
    leak = LeakageFilter(["", "  ", "!!!"])
    assert not leak
    assert not leak.matches(normalize("anything at all"))


def test_domain_blocklist_blocks_domain_and_subdomains_only() -> None:
    blocklist = DomainBlocklist(["Example.com", "*.quiz.org", ""])
    assert blocklist.blocks("https://example.com/x")
    assert blocklist.blocks("https://a.b.example.com/x")
    assert blocklist.blocks("http://www.quiz.org")
    assert not blocklist.blocks("https://notexample.com/")
    assert not blocklist.blocks("https://example.co/")
    assert not blocklist.blocks("not a url")
    assert not DomainBlocklist([]).blocks("https://example.com/")


# --- evasion: what a reader does not see must not split or change a word -----------------------

ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
SOFT_HYPHEN = "\u00ad"
INLINE_TAGS = (
    "<b>",
    "</b>",
    "<i>",
    "</I>",
    '<span class="x">',
    "</span>",
    "<a href='/w/X'>",
    "<wbr>",
)


def test_zero_width_characters_and_soft_hyphens_do_not_hide_the_question() -> None:
    leak = LeakageFilter([QUESTION])
    for hidden in [*ZERO_WIDTH, SOFT_HYPHEN, "&shy;", "&#8203;", "&#x200B;"]:
        # One invisible character inside every word: every 13-word run is broken without the fix.
        page = " ".join(word[:2] + hidden + word[2:] for word in QUESTION.split())
        assert leak.matches(normalize(page)), repr(hidden)
    assert normalize("clock\u00admaker\u200b \ufeffIlse\u2060Varen").words == (
        "clockmaker",
        "ilsevaren",
    )


def _letters(script: str, case: str, names: str) -> str:
    return "".join(
        unicodedata.lookup(f"{script} {case} LETTER {name.replace('_', ' ')}")
        for name in names.split()
    )


# Latin letters and the Cyrillic or Greek letters drawn like them, by Unicode name.
CYRILLIC_SMALL = (
    "aceijopsxy",
    _letters("CYRILLIC", "SMALL", "A ES IE BYELORUSSIAN-UKRAINIAN_I JE O ER DZE HA U"),
)
CYRILLIC_CAPITAL = (
    "ABCEHKMOPTXY",
    _letters("CYRILLIC", "CAPITAL", "A VE ES IE EN KA EM O ER TE HA U"),
)
GREEK_SMALL = (
    "aeikoptuvx",
    _letters("GREEK", "SMALL", "ALPHA EPSILON IOTA KAPPA OMICRON RHO TAU UPSILON NU CHI"),
)
GREEK_CAPITAL = (
    "ABEHIKMOPTXZ",
    _letters("GREEK", "CAPITAL", "ALPHA BETA EPSILON ETA IOTA KAPPA MU OMICRON RHO TAU CHI ZETA"),
)


def test_cyrillic_and_greek_lookalikes_do_not_hide_the_question() -> None:
    leak = LeakageFilter([QUESTION])
    for latin, lookalikes in (CYRILLIC_SMALL, CYRILLIC_CAPITAL, GREEK_SMALL, GREEK_CAPITAL):
        disguised = QUESTION.translate(str.maketrans(latin, lookalikes))
        assert disguised != QUESTION
        assert leak.matches(normalize(disguised)), lookalikes
    assert (
        normalize(QUESTION.translate(str.maketrans(*CYRILLIC_SMALL))).words
        == normalize(QUESTION).words
    )
    # An accented look-alike folds to the accented Latin letter: Cyrillic io is ie + diaeresis.
    assert (
        normalize("\N{CYRILLIC SMALL LETTER IO}").words
        == normalize("\N{LATIN SMALL LETTER E WITH DIAERESIS}").words
    )


def test_lookalike_folding_does_not_depend_on_case() -> None:
    # Russian or Greek text in another case must still match itself, so both cases of a letter
    # fold to the same Latin letter.
    for _, letters in (CYRILLIC_SMALL, CYRILLIC_CAPITAL, GREEK_SMALL, GREEK_CAPITAL):
        for letter in letters:
            assert normalize(letter.upper()).words == normalize(letter.lower()).words, letter
            assert normalize(letter).words[0].isascii(), letter
    russian = _letters("CYRILLIC", "SMALL", "VE O DE A")  # water
    assert normalize(russian.upper()).words == normalize(russian).words
    # Folding follows casefolding too: the narrow o of old Cyrillic casefolds to o.
    assert normalize("\N{CYRILLIC SMALL LETTER NARROW O}").words == ("o",)


def test_html_tags_do_not_hide_the_question() -> None:
    leak = LeakageFilter([QUESTION])
    page = (
        "<p>Which <b>reclusive</b> clock<i>maker</i> from the <a href='/wiki/Vorn'>valley</a> of "
        'Vorn built the <span class="x">silver</span> orr<wbr>ery that was later stolen</p>'
    )
    assert leak.matches(normalize(page))
    assert normalize("clock<i>maker</i>").words == ("clockmaker",)
    assert normalize("word<br>word<BR/>word<p class=x>word</p><td>word").words == ("word",) * 5
    assert LeakageFilter(["Ilse Varen"]).matches(normalize("<li>Ilse</li><li>Varen</li>"))


def test_text_that_only_resembles_markup_is_kept() -> None:
    # Unknown names are prose, not tags; a reference is decoded once, never twice.
    assert normalize("if x<y and y>z, then <Vorn> holds").words == (
        "if", "x", "y", "and", "y", "z", "then", "vorn", "holds",
    )  # fmt: skip
    assert normalize("AT&amp;T &amp;lt;b&amp;gt; &nosuch; &#99999999;").words == (
        "at", "t", "lt", "b", "gt", "nosuch", "99999999",
    )  # fmt: skip
    assert LeakageFilter(["Ilse Varen"]).matches(normalize("Ilse&nbsp;Varen"))


# --- one string per normalised text --------------------------------------------------------------


def test_normalized_text_is_one_padded_string() -> None:
    text = normalize("Hello, WORLD!  北京")
    assert text == NormalizedText(" hello world 北 京 ")
    assert [f.name for f in dataclasses.fields(NormalizedText)] == ["padded"]
    assert text.words == ("hello", "world", "北", "京")
    assert normalize("!!!") == NormalizedText("  ") and normalize("!!!").words == ()


# --- properties ------------------------------------------------------------------------------------

_OLD_WORD = re.compile(
    "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]"
    "|[^\\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]+"
)


def _old_words(text: str) -> tuple[str, ...]:
    """The normalisation before evasion handling: question ids were hashed from these words."""
    return tuple(_OLD_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def _old_matches(forbidden: list[tuple[str, ...]], document: tuple[str, ...], n: int) -> bool:
    """The word-tuple algorithm that substring search replaced: the oracle."""
    grams = {document[i : i + n] for i in range(len(document) - n + 1)}
    for words in forbidden:
        if not words:
            continue
        if len(words) >= n:
            if any(words[i : i + n] in grams for i in range(len(words) - n + 1)):
                return True
        elif any(document[i : i + len(words)] == words for i in range(len(document))):
            return True
    return False


letters_and_digits = st.characters(categories=["L", "N"])
words = st.text(letters_and_digits, min_size=1, max_size=8) | st.sampled_from(
    ["ilse", "varen", "Vorn", "orrery", "北", "京", "café", "3", "x"]
)
separators = st.text(
    st.characters(codec="utf-8", categories=["P", "Z", "S"]), min_size=1, max_size=3
)
phrases = st.lists(st.tuples(words, separators), min_size=1, max_size=16).map(
    lambda pairs: "".join(word + sep for word, sep in pairs)
)
documents = st.tuples(hostile.unicode_text, phrases, hostile.unicode_text)


def _matched_document(parts: tuple[str, str, str], n: int) -> tuple[LeakageFilter, str]:
    """A document holding the forbidden phrase parts[1] between arbitrary text, and its filter."""
    leak = LeakageFilter([parts[1]], n)
    document = f"{parts[0]} {parts[1]} {parts[2]}"
    assume(leak and leak.matches(normalize(document)))
    return leak, document


def _outside_markup(text: str, position: int) -> bool:
    """Not inside something that may be a tag: a tag broken in two would show its own words."""
    before = text[:position]
    return before.rfind("<") <= before.rfind(">")


insertions = st.lists(
    st.tuples(
        st.integers(min_value=0),
        st.sampled_from([*ZERO_WIDTH, SOFT_HYPHEN]) | st.characters(categories=["Cf"]),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None, database=None)
@given(parts=documents, n=st.integers(1, 6), hidden=insertions)
def test_invisible_characters_anywhere_never_stop_a_match(
    parts: tuple[str, str, str], n: int, hidden: list[tuple[int, str]]
) -> None:
    leak, document = _matched_document(parts, n)
    for position, char in hidden:
        at = position % (len(document) + 1)
        document = document[:at] + char + document[at:]
    assert leak.matches(normalize(document))


@settings(max_examples=300, deadline=None, database=None)
@given(
    parts=documents,
    n=st.integers(1, 6),
    tags=st.lists(st.tuples(st.integers(min_value=0), st.sampled_from(INLINE_TAGS)), max_size=8),
)
def test_inline_tags_outside_markup_never_stop_a_match(
    parts: tuple[str, str, str], n: int, tags: list[tuple[int, str]]
) -> None:
    leak, document = _matched_document(parts, n)
    for position, tag in tags:
        at = position % (len(document) + 1)
        if _outside_markup(document, at):
            document = document[:at] + tag + document[at:]
    assert leak.matches(normalize(document))


_LATIN_TO_LOOKALIKES: dict[str, str] = {}
for _latin, _lookalikes in (CYRILLIC_SMALL, GREEK_SMALL):
    for _a, _b in zip(_latin, _lookalikes, strict=True):
        _LATIN_TO_LOOKALIKES[_a] = _LATIN_TO_LOOKALIKES.get(_a, "") + _b


@settings(max_examples=300, deadline=None, database=None)
@given(parts=documents, n=st.integers(1, 6), picks=st.lists(st.integers(min_value=0), max_size=12))
def test_lookalikes_for_latin_letters_never_stop_a_match(
    parts: tuple[str, str, str], n: int, picks: list[int]
) -> None:
    leak, document = _matched_document(parts, n)
    chars = list(document)
    for pick in picks:
        at = pick % len(chars)
        options = _LATIN_TO_LOOKALIKES.get(chars[at].lower(), "")
        if options and _outside_markup(document, at) and "&" not in document[max(0, at - 40) : at]:
            lookalike = options[pick % len(options)]
            chars[at] = lookalike if chars[at].islower() else lookalike.upper()
    assert leak.matches(normalize("".join(chars)))


@settings(max_examples=500, deadline=None, database=None)
@given(text=st.text() | hostile.unicode_text, n=st.integers(1, 14))
def test_normalize_never_raises_and_a_text_matches_itself(text: str, n: int) -> None:
    normalized = normalize(text)
    assert normalized.padded.startswith(" ") and normalized.padded.endswith(" ")
    assert "  " not in normalized.padded.strip(" ")
    leak = LeakageFilter([text], n)
    assert bool(leak) == bool(normalized.words)
    if leak:
        assert leak.matches(normalized)


ordinary_characters = st.characters(codec="utf-8").filter(
    lambda c: (
        unicodedata.category(c) != "Cf"
        and c not in "<&\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0"
        and not "\u180b" <= c <= "\u180f"
        and not "\ufe00" <= c <= "\ufe0f"
        and not "\U000e0100" <= c <= "\U000e01ef"
        and not any(
            "GREEK" in unicodedata.name(d, "") or "CYRILLIC" in unicodedata.name(d, "")
            for d in unicodedata.normalize("NFKD", c).casefold()
        )
    )
)


@settings(max_examples=500, deadline=None, database=None)
@given(text=st.text(ordinary_characters, max_size=60))
def test_ordinary_text_keeps_the_words_question_ids_are_made_of(text: str) -> None:
    assert normalize(text).words == _old_words(text)


@settings(max_examples=500, deadline=None, database=None)
@given(
    forbidden=st.lists(st.lists(st.sampled_from("abcde"), max_size=9), min_size=1, max_size=3),
    document=st.lists(st.sampled_from("abcde"), max_size=40),
    n=st.integers(1, 6),
)
def test_substring_matching_agrees_with_the_word_tuple_algorithm(
    forbidden: list[list[str]], document: list[str], n: int
) -> None:
    leak = LeakageFilter([" ".join(words) for words in forbidden], n)
    expected = _old_matches([tuple(words) for words in forbidden], tuple(document), n)
    assert leak.matches(normalize(", ".join(document))) == expected


def test_shortcut_for_text_without_greek_or_cyrillic_agrees_with_the_full_fold() -> None:
    # normalize() decomposes and folds only text holding a Greek or Cyrillic character. With one
    # appended, every other character goes the full way too and must come out the same.
    for code in range(0x20000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        assert normalize(char + " \N{CYRILLIC SMALL LETTER A}").words == (
            *normalize(char).words,
            "a",
        ), hex(code)
