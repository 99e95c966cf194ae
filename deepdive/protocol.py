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

from services.base.errors import RequestError, ToolError, UpstreamBadResponse

__all__ = [
    "BROWSING_TOOLS",
    "COMPACT_SYSTEM_PROMPT",
    "FINISH",
    "MISSING",
    "NO_RESULTS",
    "OBSERVATION_CLOSE",
    "OBSERVATION_OPEN",
    "PAGE_CHARS",
    "SYSTEM_PROMPT",
    "SYSTEM_PROMPTS",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_ERROR_KINDS",
    "TOOL_NAMES",
    "TOOL_SCHEMAS",
    "TOOL_SERVER_FAILED",
    "Failure",
    "ProtocolError",
    "RewardReply",
    "RewardRequest",
    "ToolCall",
    "ToolReply",
    "ToolRequest",
    "find_tool_calls",
    "format_observation",
    "format_page",
    "format_results",
    "format_tool_call",
    "json_kind",
    "model_text",
    "parse_tool_call_body",
    "reward_labels",
    "split_pages",
    "strip_end_markers",
    "tool_error_kind",
    "validate_arguments",
]

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


class ProtocolError(ToolError):
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
# The largest whole number an argument may be (what the digits above allow): a model's 1e30
# became a 100-bit int that JSON encoders refuse (orjson raises TypeError past 64 bits).
MAX_WHOLE_NUMBER = 999_999_999


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
    if number > MAX_WHOLE_NUMBER:
        raise ProtocolError(
            "invalid_arguments",
            f'"{key}" must be at most {MAX_WHOLE_NUMBER}, got {str(value)[:40]}',
        )
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


# -- the HTTP envelopes: what the rollout sends the tool and reward servers, and their answers --
#
# One owner for each JSON form that crosses between the rollout and a server: the rollout
# writes a request with `as_json` and reads the reply with `parse`; the server parses the
# request with `parse` and writes the reply with `as_json`. A request that is not an envelope
# is refused with a RequestError naming the field (the server answers it with a 4xx); a reply
# that is not one is an UpstreamBadResponse (the rollout's error observation), or, for a
# reward, a 0 with the error saying why.

MISSING: Any = object()  # a field the client did not send, told apart from an explicit null


def json_kind(value: Any) -> str:
    """How an error message names the JSON type a client sent."""
    if value is MISSING:
        return "nothing (the field is missing)"
    if value is None:
        return "null"
    names = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }
    return names.get(type(value), type(value).__name__)


# What failed when a tool call failed, for the tool-error share that stops a run whose tools
# do not work (deepdive.tool_errors): the infrastructure's failures, by kind. The model's own
# mistakes (a bad link id, a refused URL, a page that is not there) are no tool error: they
# reach the model as observations and count nowhere. Each kind, from the tool server's error
# codes (services/base/errors.py):
#   upstream_unavailable  a search or page provider's 5xx or transport error after every retry
#                         (no route out, a proxy refusing, DNS): upstream_unavailable, upstream_error
#   rate_limited          HTTP 429 after every retry: upstream_rate_limited
#   auth                  401/402/403, a key missing, wrong or out of credit: upstream_auth
#   deadline              the call ran past its total deadline: deadline_exceeded
#   bad_response          malformed JSON, an API error on HTTP 200, a refused request:
#                         upstream_bad_response
#   tool_server           the rollout could not reach the tool server, or its reply was no
#                         envelope (set by the rollout, never by the server)
TOOL_ERROR_KINDS = (
    "upstream_unavailable",
    "rate_limited",
    "auth",
    "deadline",
    "bad_response",
    "tool_server",
)
TOOL_SERVER_FAILED = "tool_server_failed"  # the rollout's code when the tool server failed it
_KIND_OF_CODE = {
    TOOL_SERVER_FAILED: "tool_server",
    "upstream_unavailable": "upstream_unavailable",
    "upstream_error": "upstream_unavailable",
    "upstream_rate_limited": "rate_limited",
    "upstream_auth": "auth",
    "deadline_exceeded": "deadline",
    "upstream_bad_response": "bad_response",
}


def tool_error_kind(code: str) -> str | None:
    """The tool-error kind (TOOL_ERROR_KINDS) of a failed call's error code; None for the
    model's own mistakes."""
    return _KIND_OF_CODE.get(code)


@dataclass(frozen=True)
class Failure:
    """Why a call failed: a machine-readable code and one line for a person (the error codes
    of services/base/errors.py)."""

    code: str
    message: str

    def as_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message}

    @classmethod
    def parse(cls, value: Any) -> Failure | None:
        """The error object of a reply, or None when there is none. A bare string (an older
        server's) is its message."""
        if value is None or value is False:
            return None
        if isinstance(value, str):
            return cls("error", value)
        if isinstance(value, dict):
            code, message = value.get("code"), value.get("message")
            return cls(
                code if isinstance(code, str) and code else "error",
                message if isinstance(message, str) else str(message or code or "error"),
            )
        return cls("error", str(value)[:200])


MAX_SESSION_ID_CHARS = 256


@dataclass(frozen=True)
class ToolRequest:
    """POST /tool: one tool call of an episode (DeepDive's envelope: {session_id, name,
    arguments, remote_env_info: {forbidden_texts}}). `arguments` are the model's and are
    checked by the tool (`validate_arguments`), so their problems reach the model as
    observations, never as HTTP errors."""

    session_id: str
    name: str
    arguments: Any = field(default_factory=dict)
    forbidden_texts: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "name": self.name,
            "arguments": self.arguments,
            "remote_env_info": {"forbidden_texts": list(self.forbidden_texts)},
        }

    @classmethod
    def parse(cls, body: Any) -> ToolRequest:
        """The client's envelope, checked; raises RequestError naming the field and the
        expected type."""
        if not isinstance(body, dict):
            raise RequestError(f"the request body must be a JSON object, got {json_kind(body)}")
        session_id = body.get("session_id", MISSING)
        if not isinstance(session_id, str) or not session_id.strip():
            raise RequestError(
                f"field 'session_id': expected a non-empty string, got {json_kind(session_id)}"
            )
        if len(session_id) > MAX_SESSION_ID_CHARS:
            raise RequestError(f"field 'session_id': longer than {MAX_SESSION_ID_CHARS} characters")
        name = body.get("name", MISSING)
        if not isinstance(name, str):
            raise RequestError(
                f"field 'name': expected a string (the tool name), got {json_kind(name)}"
            )
        arguments = body.get("arguments", {})
        forbidden = _forbidden_texts(body, "")
        return cls(session_id, name, {} if arguments is None else arguments, forbidden)


@dataclass(frozen=True)
class ToolReply:
    """The tool server's answer to POST /tool, always HTTP 200 for a call it ran: the
    observation the model reads and, when the call failed, the error (whose message is the
    observation too). {output, observation} carry the same text, as DeepDive's rollout reads
    `output`; the error also names its tool-error `kind` (TOOL_ERROR_KINDS, or null for the
    model's own mistakes)."""

    observation: str
    error: Failure | None = None

    @property
    def error_kind(self) -> str | None:
        return tool_error_kind(self.error.code) if self.error is not None else None

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"output": self.observation, "observation": self.observation}
        if self.error is not None:
            body["error"] = {**self.error.as_json(), "kind": self.error_kind}
        return body

    @classmethod
    def parse(cls, body: Any) -> ToolReply:
        """A tool server's reply (ours, or DeepDive's, which sends only `output`); raises
        UpstreamBadResponse when it is no envelope."""
        if not isinstance(body, dict):
            raise UpstreamBadResponse("tool_server", "the reply is not a JSON object")
        text = body.get("observation", MISSING)
        if text is MISSING:
            text = body.get("output", MISSING)
        if not isinstance(text, str):
            raise UpstreamBadResponse(
                "tool_server", f"the reply's observation is {json_kind(text)}, not a string"
            )
        return cls(text, Failure.parse(body.get("error")))


@dataclass(frozen=True)
class RewardRequest:
    """POST /evaluate (and each item of /evaluate/batch): one episode to judge. The rollout
    sends {prompt, response, label: {answer, aliases}, task_unfinished, remote_env_info:
    {forbidden_texts}}; the server also reads slime's remote_rm payload ({prompt, response,
    label}) and DeepDive's ({response | history, label, task_unfinished, format_valid,
    remote_env_info}). `labels` is the reference answer first, then its aliases; `question`
    is the first forbidden text, else the prompt's last user turn (set by `parse`)."""

    trajectory: str
    labels: tuple[str, ...]
    question: str = ""
    client_unfinished: bool = False  # the client says the task was unfinished or truncated
    client_format_invalid: bool = False  # the client says the format is invalid
    prompt: str | list[Any] = ""
    forbidden_texts: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": self.prompt,
            "response": self.trajectory,
            "label": {"answer": self.labels[0], "aliases": list(self.labels[1:])},
            "task_unfinished": self.client_unfinished,
            "remote_env_info": {"forbidden_texts": list(self.forbidden_texts)},
        }
        if self.client_format_invalid:
            body["format_valid"] = False
        return body

    @classmethod
    def parse(cls, body: Any, where: str = "") -> RewardRequest:
        """One payload, checked; RequestError names the field (prefixed by `where` in a batch)."""
        if not isinstance(body, dict):
            raise RequestError(f"{where}the request must be a JSON object, got {json_kind(body)}")
        labels = _labels(body.get("label", MISSING), where)
        history = body.get("history", MISSING)
        response = body.get("response", MISSING)
        if response is not MISSING and response is not None:
            if not isinstance(response, str):
                raise RequestError(
                    f"{where}field 'response': expected a string, got {json_kind(response)}"
                )
            trajectory = response
        elif history is not MISSING and history is not None:
            trajectory = _trajectory_from_history(history, where)
        else:
            raise RequestError(f"{where}field 'response': missing (send 'response' or 'history')")
        forbidden = _forbidden_texts(body, where)
        question = forbidden[0] if forbidden else _question(body, where)
        unfinished = _flag(body, "task_unfinished", where) or _flag(body, "truncated", where)
        format_valid = body.get("format_valid", True)
        if not isinstance(format_valid, bool):
            raise RequestError(
                f"{where}field 'format_valid': expected true or false, got "
                f"{json_kind(format_valid)}"
            )
        prompt = body.get("prompt")
        return cls(
            trajectory,
            labels,
            question,
            unfinished,
            not format_valid,
            prompt if isinstance(prompt, str | list) else "",
            forbidden,
        )


@dataclass(frozen=True)
class RewardReply:
    """The reward server's answer for one episode: the strict binary reward and why (the
    format check, the judge's verdict, the answer it read), or the error that made it 0."""

    reward: float
    format_ok: bool | None = None
    format_reason: str | None = None
    answer_ok: bool | None = None
    extracted_answer: str | None = None
    judge: dict[str, Any] | None = None
    error: Failure | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "format_ok": self.format_ok,
            "format_reason": self.format_reason,
            "answer_ok": self.answer_ok,
            "extracted_answer": self.extracted_answer,
            "judge": self.judge,
            "error": None if self.error is None else self.error.as_json(),
        }

    @classmethod
    def failed(cls, code: str, message: str) -> RewardReply:
        return cls(0, error=Failure(code, message))

    @classmethod
    def parse(cls, body: Any) -> RewardReply:
        """A reward server's answer; never raises: anything but a finite number is reward 0,
        with an error saying so (never a crash, never a reward the server did not give)."""
        if not isinstance(body, dict):
            return cls.failed("bad_reply", f"the reward server answered {json_kind(body)}")
        given = body.get("reward")
        error = Failure.parse(body.get("error"))
        reward: float = 0
        if isinstance(given, int | float) and not isinstance(given, bool) and math.isfinite(given):
            reward = given
        else:
            error = error or Failure("bad_reply", "the answer has no finite numeric reward")

        def optional(name: str, kind: type) -> Any:
            value = body.get(name)
            return value if isinstance(value, kind) else None

        return cls(
            reward,
            optional("format_ok", bool),
            optional("format_reason", str),
            optional("answer_ok", bool),
            optional("extracted_answer", str),
            optional("judge", dict),
            error,
        )


def _forbidden_texts(body: dict[str, Any], where: str) -> tuple[str, ...]:
    env = body.get("remote_env_info", {})
    if env is None:
        env = {}
    if not isinstance(env, dict):
        raise RequestError(
            f"{where}field 'remote_env_info': expected an object, got {json_kind(env)}"
        )
    forbidden = env.get("forbidden_texts", [])
    if forbidden is None:
        forbidden = []
    if not isinstance(forbidden, list) or not all(isinstance(t, str) for t in forbidden):
        raise RequestError(
            f"{where}field 'remote_env_info.forbidden_texts': expected a list of strings, "
            f"got {json_kind(forbidden)}"
        )
    return tuple(forbidden)


def reward_labels(label: Any, aliases: Any = None) -> tuple[str, ...]:
    """The reference answer(s) of a row's `label`, then its `aliases`, as the reward server
    reads them; raises RequestError naming what is neither text nor a number."""
    labels = _labels(label, "")
    if aliases is None or aliases == []:
        return labels
    if not isinstance(aliases, list):
        raise RequestError(
            f"field 'label.aliases': expected a list of strings, got {json_kind(aliases)}"
        )
    return labels + _labels(aliases, "")


def _labels(label: Any, where: str) -> tuple[str, ...]:
    expected = "expected a non-empty string, a number, a list of strings, or {answer, aliases}"
    values: list[Any]
    if label is MISSING or label is None:
        raise RequestError(f"{where}field 'label': missing ({expected})")
    if isinstance(label, dict):
        aliases = label.get("aliases") or []
        if not isinstance(aliases, list):
            raise RequestError(f"{where}field 'label.aliases': expected a list of strings")
        values = [label.get("answer"), *aliases]
    elif isinstance(label, list):
        values = label
    else:
        values = [label]
    texts = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise RequestError(f"{where}field 'label': {expected}, got {json_kind(value)} inside")
        text = str(value).strip()
        if text:
            texts.append(text)
    if not texts:
        raise RequestError(f"{where}field 'label': {expected}, got an empty value")
    return tuple(texts)


def _trajectory_from_history(history: Any, where: str) -> str:
    """DeepDive's message list as one trajectory: assistant turns as written, every later
    non-assistant message as an observation."""
    if not isinstance(history, list):
        raise RequestError(
            f"{where}field 'history': expected a list of messages, got {json_kind(history)}"
        )
    parts: list[str] = []
    seen_assistant = False
    for index, message in enumerate(history):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"{where}field 'history[{index}]': expected {{role, content}}")
        content = message.get("content", "")
        if not isinstance(content, str):
            raise RequestError(f"{where}field 'history[{index}].content': expected a string")
        if message["role"] == "assistant":
            seen_assistant = True
            parts.append(content)
        elif seen_assistant:
            parts.append(
                content
                if content.lstrip().startswith(OBSERVATION_OPEN)
                else format_observation(content)
            )
    return "\n".join(parts)


_CHATML_USER = re.compile(r"<\|im_start\|>user\s*\n(.*?)(?:<\|im_end\|>|\Z)", re.DOTALL)


def _question(body: dict[str, Any], where: str) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        users = _CHATML_USER.findall(prompt)
        return (users[-1] if users else prompt).strip()
    messages = prompt if isinstance(prompt, list) else body.get("history")
    if isinstance(messages, list):
        for message in messages:
            if (
                isinstance(message, dict)
                and message.get("role") == "user"
                and isinstance(message.get("content"), str)
            ):
                return str(message["content"]).strip()
    if prompt is not None and not isinstance(prompt, list):
        raise RequestError(
            f"{where}field 'prompt': expected a string or a list of messages, got "
            f"{json_kind(prompt)}"
        )
    return ""


def _flag(body: dict[str, Any], name: str, where: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{where}field '{name}': expected true or false, got {json_kind(value)}")
    return value
