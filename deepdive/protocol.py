"""The agent's protocol, in one place: the tools, their schemas, the tool-call syntax, the
observation wrapping and the final-answer action.

The data converter tells the model this protocol (system prompt, tool schemas), the rollout
parses the model's turns with it, the tool server validates arguments with it, and the reward
server's format check judges whole trajectories with it. Changing the protocol here changes it
everywhere at once.

Syntax (Qwen style): a turn ends with one tool call

    <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>

whitespace and a ```json code fence around the JSON are tolerated; anything else is refused.
Tool output comes back as <observation>...</observation>. The episode ends with the `finish`
tool: {"name": "finish", "arguments": {"answer": "..."}}.

What the tools show is part of the protocol too: search results as DeepDive's numbered blocks
and pages in pieces of PAGE_CHARS with the call that reads on (the tool server writes them, the
demonstrations the warm start learns from write them identically).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
OBSERVATION_OPEN = "<observation>"
OBSERVATION_CLOSE = "</observation>"
FINISH = "finish"
BROWSING_TOOLS = ("search", "click", "open")
TOOL_NAMES = (*BROWSING_TOOLS, FINISH)
MAX_RESULTS = 20
PAGE_CHARS = 10_000  # characters per page of open/click output (DeepDive cuts pages at 10k)
END_MARKERS = ("<|im_end|>", "<|endoftext|>", "</s>", "<|eot_id|>")

TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web. Returns numbered results (title, URL, snippet).",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "The search query."},
                    "num": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_RESULTS,
                        "description": "How many results (default 10).",
                    },
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "click",
            "description": "Open result number `link_id` of your latest search.",
            "parameters": {
                "type": "object",
                "properties": {
                    "link_id": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "The result's number.",
                    },
                    "page": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Page of a long document (default 1).",
                    },
                },
                "required": ["link_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "open",
            "description": "Open a web page by URL and read it as text.",
            "parameters": {
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "An http(s) URL."},
                    "page": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "Page of a long document (default 1).",
                    },
                },
                "required": ["url"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": FINISH,
            "description": "Give your final answer and end the task. Call it exactly once, last.",
            "parameters": {
                "type": "object",
                "properties": {
                    "answer": {
                        "type": "string",
                        "description": "The final answer, as short as possible.",
                    }
                },
                "required": ["answer"],
            },
        },
    },
)

SYSTEM_PROMPT = f"""You are a deep-research agent. Answer the user's question by searching the web and reading pages.

You can call these tools: {", ".join(TOOL_NAMES)}. To call one, end your turn with exactly one call:
{TOOL_CALL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{TOOL_CALL_CLOSE}
The result comes back inside {OBSERVATION_OPEN}...{OBSERVATION_CLOSE}.

- search {{"query": str, "num": int}}: numbered results with title, URL and snippet.
- click {{"link_id": int, "page": int}}: open a result of your latest search.
- open {{"url": str, "page": int}}: open a page by URL. Long pages come in pages; ask for the next one.
- {FINISH} {{"answer": str}}: give your final answer and end the task.

Think before each call. Verify the answer from the pages you read. When you are sure, call {FINISH}
once with a short, exact answer (a name, a number, a date), not a list of guesses."""


# For the tiny CPU policy of the embedded default: the same protocol in a few dozen tokens
# (every prompt token costs attention in every forward pass of a 2-core run).
COMPACT_SYSTEM_PROMPT = (
    f'Answer by searching. One call per turn: {TOOL_CALL_OPEN}{{"name": ..., "arguments": ...}}'
    f"{TOOL_CALL_CLOSE}. Tools: search {{query, num}}, click {{link_id}}, open {{url}}, "
    f"{FINISH} {{answer}}."
)
SYSTEM_PROMPTS = {"full": SYSTEM_PROMPT, "compact": COMPACT_SYSTEM_PROMPT}


class ProtocolError(ValueError):
    """A tool call that breaks the protocol. `code` is machine-readable; the message is for the model."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)


def parse_tool_call_body(body: str) -> ToolCall:
    """The JSON between <tool_call> and </tool_call>, validated. Raises `ProtocolError`."""
    text = body.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ProtocolError("invalid_json", "the tool call is not valid JSON") from None
    if not isinstance(data, dict):
        raise ProtocolError(
            "invalid_call", 'a tool call is a JSON object {"name": ..., "arguments": {...}}'
        )
    name = data.get("name")
    if not isinstance(name, str):
        raise ProtocolError("invalid_call", 'the tool call needs a "name" string')
    if name not in TOOL_NAMES:
        raise ProtocolError(
            "unknown_tool", f"unknown tool {name[:64]!r}; the tools are {', '.join(TOOL_NAMES)}"
        )
    arguments = data.get("arguments", {})
    return ToolCall(name, validate_arguments(name, arguments))


def validate_arguments(name: str, arguments: Any) -> dict[str, Any]:
    """The arguments of tool `name`, checked and normalised (numbers as int, strings stripped)."""
    if not isinstance(arguments, dict):
        raise ProtocolError("invalid_arguments", f"{name} arguments must be a JSON object")
    if name == "search":
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ProtocolError("invalid_arguments", 'search needs a non-empty "query" string')
        return {"query": query.strip(), "num": _whole_number(arguments, "num", None)}
    if name == "click":
        if arguments.get("link_id") is None:
            raise ProtocolError(
                "invalid_arguments",
                'click needs "link_id": the number of a result of your latest search',
            )
        return {
            "link_id": _whole_number(arguments, "link_id", None),
            "page": _whole_number(arguments, "page", 1),
        }
    if name == "open":
        url = arguments.get("url")
        if not isinstance(url, str) or not url.strip():
            raise ProtocolError("invalid_arguments", 'open needs a "url" string')
        return {"url": url.strip(), "page": _whole_number(arguments, "page", 1)}
    if name == FINISH:
        answer = arguments.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            raise ProtocolError("invalid_arguments", f'{FINISH} needs a non-empty "answer" string')
        return {"answer": answer.strip()}
    raise ProtocolError(
        "unknown_tool", f"unknown tool {name[:64]!r}; the tools are {', '.join(TOOL_NAMES)}"
    )


# ASCII digits only: str.isdigit() is also true for "²" or "¹²³", which int() refuses.
_ASCII_DIGITS = re.compile(r"[0-9]{1,9}")


def _whole_number(arguments: dict[str, Any], key: str, default: int | None) -> Any:
    """A whole number >= 1; "3" and 3.0 are accepted as 3, as models write both."""
    value = arguments.get(key)
    if value is None:
        return default
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and _ASCII_DIGITS.fullmatch(value.strip()):
        number = int(value.strip())
    if number is None:
        raise ProtocolError(
            "invalid_arguments", f'"{key}" must be a whole number, got {str(value)[:40]!r}'
        )
    if number < 1:
        raise ProtocolError("invalid_arguments", f'"{key}" must be at least 1, got {number}')
    return number


@dataclass(frozen=True)
class ParsedCall:
    """A tool call found in a trajectory: the call, or why it is malformed."""

    call: ToolCall | None
    error: ProtocolError | None
    end: int  # offset just after the call in the model text


_OBSERVATION = re.compile(
    re.escape(OBSERVATION_OPEN) + r".*?(?:" + re.escape(OBSERVATION_CLOSE) + r"|\Z)", re.DOTALL
)
_CALL = re.compile(
    re.escape(TOOL_CALL_OPEN) + r"(.*?)(" + re.escape(TOOL_CALL_CLOSE) + r"|\Z)", re.DOTALL
)


def model_text(trajectory: str) -> str:
    """The trajectory without observations: only what the model wrote (tool output may quote
    anything, tool-call syntax included, so it is never searched for calls)."""
    return _OBSERVATION.sub("\n", trajectory)


def find_tool_calls(text: str) -> list[ParsedCall]:
    """Every tool call in model-written text, in order; an unterminated one is an error."""
    found = []
    for match in _CALL.finditer(text):
        if not match.group(2):
            found.append(
                ParsedCall(
                    None, ProtocolError("unterminated", "a tool call is not closed"), match.end()
                )
            )
            continue
        try:
            found.append(ParsedCall(parse_tool_call_body(match.group(1)), None, match.end()))
        except ProtocolError as error:
            found.append(ParsedCall(None, error, match.end()))
    return found


def strip_end_markers(text: str) -> str:
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for marker in END_MARKERS:
            if text.endswith(marker):
                text = text[: -len(marker)].rstrip()
                changed = True
    return text


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """How a call is written (demonstrations and tests use it; the model learns it)."""
    return (
        TOOL_CALL_OPEN
        + orjson.dumps({"name": name, "arguments": arguments}).decode()
        + TOOL_CALL_CLOSE
    )


def format_observation(text: str) -> str:
    """Tool output as the model reads it after its call, in the rollout and in demonstrations
    alike (and as the reward server rebuilds a DeepDive history)."""
    return f"\n{OBSERVATION_OPEN}\n{text}\n{OBSERVATION_CLOSE}\n"


class Listed(Protocol):
    """A search result as the model sees it."""

    @property
    def title(self) -> str: ...

    @property
    def url(self) -> str: ...

    @property
    def snippet(self) -> str: ...


NO_RESULTS = "No results found."


def format_results(results: Sequence[Listed]) -> str:
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
