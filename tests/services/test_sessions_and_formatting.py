from deepdive.protocol import NO_RESULTS, format_page, format_results, split_pages
from services.tool_server.models import Page, SearchResult
from services.tool_server.sessions import SessionSettings, SessionStore
from services.tool_server.urls import normalize_url
from tests.helpers import FakeClock

RESULT = (SearchResult("t", "https://x.example/", "s"),)


def test_sessions_expire_after_ttl() -> None:
    clock = FakeClock(now=0.0)
    store = SessionStore(SessionSettings(max_sessions=10, ttl_s=60), clock=clock)
    store.remember_results("a", RESULT)
    clock.now = 59
    assert store.latest_results("a") == RESULT
    clock.now = 61
    assert store.latest_results("a") is None
    assert len(store) == 0


def test_sessions_are_capped_over_a_long_run() -> None:
    store = SessionStore(SessionSettings(max_sessions=100, ttl_s=3600))
    for step in range(3000):  # a 3,000-step run, one new trajectory per step
        store.remember_results(f"trajectory-{step}", RESULT)
    assert len(store) == 100
    assert store.latest_results("trajectory-2999") == RESULT
    assert store.latest_results("trajectory-0") is None


def test_a_replacement_store_tells_lost_sessions_from_its_own() -> None:
    """A worker started in place of one that died: a session it has not served had its state
    in the old worker (lost); one it served is its own, with or without results."""
    store = SessionStore(SessionSettings(), replacement=True)
    assert store.lost("from-before")
    store.served("mine")
    assert not store.lost("mine")
    original = SessionStore(SessionSettings())  # the first worker of its port lost nothing
    assert not original.lost("anything")
    original.served("anything")  # and records nothing
    assert len(original) == 0


def test_close_forgets_a_session() -> None:
    store = SessionStore(SessionSettings())
    store.remember_results("a", RESULT)
    assert store.close("a") and not store.close("a")


def test_results_are_numbered_from_one_in_deepdive_format() -> None:
    text = format_results(
        [SearchResult("A", "https://a/", "sa"), SearchResult("B", "https://b/", "sb")]
    )
    assert text == "【1】A\nhttps://a/\nsa\n\n【2】B\nhttps://b/\nsb"
    assert format_results([]) == NO_RESULTS


def test_split_pages_cuts_at_whitespace_and_loses_nothing() -> None:
    text = " ".join(f"word{i}" for i in range(3000))
    pieces = split_pages(text, 1000)
    assert all(len(p) <= 1000 for p in pieces)
    assert " ".join(pieces).split() == text.split()
    assert split_pages("short", 1000) == ["short"]


def test_split_pages_hard_cuts_text_without_spaces() -> None:
    pieces = split_pages("x" * 2500, 1000)
    assert [len(p) for p in pieces] == [1000, 1000, 500]


def test_page_format_says_where_it_is_and_how_to_read_on() -> None:
    page = Page("https://a.example/p", "Title", "")
    pieces = ["one", "two", "three"]
    first = format_page(page, pieces, 1)
    assert first.startswith("Title: Title\nURL: https://a.example/p\nPage 1 of 3\n\none")
    assert 'call open with {"url":"https://a.example/p","page":2}' in first
    assert format_page(page, pieces, 3).endswith("[Page 3 of 3: the end of this page.]")
    assert format_page(page, ["only"], 1) == "Title: Title\nURL: https://a.example/p\n\nonly"


def test_normalize_url_gives_one_spelling_per_page() -> None:
    same = [
        "https://Example.com/a/b/",
        "https://example.com:443/a/b",
        "https://example.com/a/b#section",
        "https://example.com/a/%62?utm_source=x",
        " https://EXAMPLE.com./a/b ",
    ]
    assert {normalize_url(u) for u in same} == {"https://example.com/a/b"}
    assert normalize_url("https://example.com") == "https://example.com/"
    assert normalize_url("http://example.com:8080/x?b=2&a=1") == "http://example.com:8080/x?b=2&a=1"
