"""The README is the front door and docs/ holds the rest: the README stays short, and every
relative link in it and in docs/ leads to a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_MAX_LINES = 220
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) or [text](target "title"); images too
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.IGNORECASE)


def prose(text: str) -> str:
    """The text outside fenced code blocks (a link in an example is not a link)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page.read_text(encoding="utf-8")))
        if not EXTERNAL.match(target)
    ]


def broken_links(page: Path) -> list[str]:
    """The page's relative links whose file (the part before any #anchor) does not exist."""
    return [
        target
        for target in relative_links(page)
        if not (page.parent / target.split("#", 1)[0]).exists()
    ]


def test_the_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): "
        "move the detail to a page under docs/ and link it"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"


def test_the_link_check_sees_links() -> None:
    """The pattern finds the README's links to docs/ (a pattern that found none would pass
    every page)."""
    assert any(target.startswith("docs/") for target in relative_links(README))


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "[here](missing.md) [web](https://example.org) [anchor](#top)\n"
        "```\n[in code](also-missing.md)\n```\n[ok](page.md#section)\n"
    )
    assert relative_links(page) == ["missing.md", "page.md#section"]
    assert broken_links(page) == ["missing.md"]


# what differs between sites (issue 28): docs/cluster.md's "Your site" table has a row for each,
# and each row's "checked" cell names tests that exist
SITE_DIFFERENCES = (
    "Slurm version", "Task plugin", "Egress", "Apptainer version", "Binds", "File system",
    "Node memory",
)  # fmt: skip


def your_site_rows(text: str) -> dict[str, str]:
    section = text.split("## Your site", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| \*\*([^*]+)\*\*[^|]*\|[^|]*\| (.*) \|$", section, re.MULTILINE)
    return dict(rows)


def test_your_site_names_each_difference_and_where_it_is_tested() -> None:
    rows = your_site_rows((ROOT / "docs" / "cluster.md").read_text(encoding="utf-8"))
    assert set(SITE_DIFFERENCES) <= set(rows), sorted(rows)
    for name in SITE_DIFFERENCES:
        paths = re.findall(r"`(tests/[\w/]+\.py)`", rows[name])
        assert paths, f"the {name} row names no test"
        assert [path for path in paths if not (ROOT / path).is_file()] == [], name


def test_the_site_check_sees_a_missing_row() -> None:
    text = "## Your site\n\n| **Slurm version** | x | `tests/test_docs.py` |\n\n## Next\n"
    assert your_site_rows(text) == {"Slurm version": "`tests/test_docs.py`"}
