"""How results and pages read to the model (DeepDive's numbered-block format, kept compatible)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import orjson

from services.tool_server.models import SearchResult

NO_RESULTS = "No results found."


def format_results(results: Sequence[SearchResult]) -> str:
    """`【1】title\\nurl\\nsnippet` blocks, numbered from 1 as `click` expects."""
    if not results:
        return NO_RESULTS
    return "\n".join(
        f"【{i}】{r.title}\n{r.url}\n{r.snippet}\n" for i, r in enumerate(results, start=1)
    ).strip()


def split_pages(text: str, page_chars: int) -> list[str]:
    """Cut `text` into pieces of at most `page_chars`, at a line break or space where one is near."""
    pieces: list[str] = []
    start = 0
    while len(text) - start > page_chars:
        end = start + page_chars
        floor = start + page_chars * 4 // 5
        cut = text.rfind("\n", floor, end)
        if cut == -1:
            cut = text.rfind(" ", floor, end)
        if cut == -1:
            cut = end
        pieces.append(text[start:cut].strip())
        start = cut
    pieces.append(text[start:].strip())
    return pieces


class Located(Protocol):
    """A page or a prepared page: what a shown piece is headed with."""

    @property
    def url(self) -> str: ...

    @property
    def title(self) -> str: ...


def format_page(
    page: Located, pieces: Sequence[str], number: int, cut_at: int | None = None
) -> str:
    """One piece of a page, saying where it is and how to read on (and, on the last piece of a
    page cut at `cut_at` characters, that the rest is not shown)."""
    header = [f"Title: {page.title}"] if page.title else []
    header.append(f"URL: {page.url}")
    total = len(pieces)
    cut_note = (
        f"\n\n[The page is longer than {cut_at:,} characters; the rest is not shown.]"
        if cut_at is not None and number == total
        else ""
    )
    if total == 1:
        return "\n".join(header) + "\n\n" + pieces[0] + cut_note
    header.append(f"Page {number} of {total}")
    body = "\n".join(header) + "\n\n" + pieces[number - 1]
    if number < total:
        next_call = orjson.dumps({"url": page.url, "page": number + 1}).decode()
        body += f"\n\n[Page {number} of {total}. To read on, call open with {next_call}.]"
    else:
        body += f"\n\n[Page {number} of {total}: the end of this page.]" + cut_note
    return body
