"""Readable text from HTML: drop scripts, styles and page chrome; one line per block element."""

from __future__ import annotations

import re

from selectolax.lexbor import LexborHTMLParser

_DROP = "script, style, noscript, template, svg, canvas, iframe, nav, footer, header, aside, form"
_BLOCKS = frozenset(
    [
        "address",
        "article",
        "blockquote",
        "br",
        "dd",
        "div",
        "dl",
        "dt",
        "figcaption",
        "figure",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "hr",
        "li",
        "main",
        "ol",
        "p",
        "pre",
        "section",
        "table",
        "tbody",
        "td",
        "th",
        "thead",
        "tr",
        "ul",
    ]
)
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")
_BLANK_LINES = re.compile(r"\n{3,}")


def html_to_text(html: str) -> tuple[str, str]:
    """(title, text) of an HTML document."""
    tree = LexborHTMLParser(html)
    title_node = tree.css_first("title")
    title = " ".join(title_node.text().split()) if title_node is not None else ""
    for node in tree.css(_DROP):
        node.decompose()
    root = tree.body or tree.root
    if root is None:
        return title, ""
    parts: list[str] = []
    for node in root.traverse(include_text=True):
        if node.tag == "-text":
            parts.append(node.text(deep=False).replace("\n", " "))  # source newlines are spaces
        elif node.tag in _BLOCKS:
            parts.append("\n")
    lines = (_SPACES.sub(" ", line).strip() for line in "".join(parts).split("\n"))
    text = _BLANK_LINES.sub("\n\n", "\n".join(lines)).strip()
    return title, text
