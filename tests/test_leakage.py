from services.tool_server.leakage import DomainBlocklist, LeakageFilter, normalize

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
