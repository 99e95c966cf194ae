"""The search cache charges a result list an estimate of its memory (services/tool_server/
models.py results_nbytes) made without building the leakage filter's normalised form; the
estimate must never be below what the list holds once that form is built."""

from __future__ import annotations

import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from services.tool_server.models import SearchResult, results_nbytes


def measured(results: tuple[SearchResult, ...]) -> int:
    """What the list holds with every result's normalised form built (it lives in __dict__)."""
    for result in results:
        _ = result.normalized
    return sys.getsizeof(results) + sum(
        sys.getsizeof(r)
        + sys.getsizeof(r.__dict__)
        + sum(sys.getsizeof(t) for t in (r.title, r.url, r.snippet, r.normalized.padded))
        for r in results
    )


texts = st.text(max_size=300)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(texts, texts, texts), max_size=12))
def test_the_estimate_bounds_the_memory_held(fields: list[tuple[str, str, str]]) -> None:
    estimate = results_nbytes(tuple(SearchResult(*f) for f in fields))
    assert estimate >= measured(tuple(SearchResult(*f) for f in fields))


def test_the_estimate_is_close_for_plain_text() -> None:
    """Not wildly above either: the cache's byte budget should still hold what it says."""
    results = tuple(
        SearchResult(f"Title {i} of a page", f"https://site{i}.example/a/b", "snippet " * 25)
        for i in range(10)
    )
    assert measured(results) <= results_nbytes(results) <= 2 * measured(results)
