"""The format half of the strict reward, checked from the trajectory text itself.

A trajectory is well-formed only when every tool call the model wrote is valid JSON naming a
known tool with valid arguments (the shared protocol decides), it ends with exactly one `finish`
call carrying a non-empty answer, and nothing follows that call but end-of-turn markers. Tool
output (inside <observation>) is never searched for calls: a web page can quote anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from deepdive.protocol import FINISH, find_tool_calls, model_text, strip_end_markers


@dataclass(frozen=True)
class FormatVerdict:
    ok: bool
    answer: str | None = None
    code: str | None = None
    reason: str | None = None


def _fail(code: str, reason: str) -> FormatVerdict:
    return FormatVerdict(False, None, code, reason)


def check_format(trajectory: str) -> FormatVerdict:
    text = model_text(trajectory)
    calls = find_tool_calls(text)
    for number, found in enumerate(calls, start=1):
        if found.error is not None:
            return _fail("malformed_tool_call", f"tool call {number}: {found.error.message}")
    names = [found.call.name for found in calls if found.call is not None]
    finishes = names.count(FINISH)
    if finishes == 0:
        return _fail(
            "unfinished", f"the trajectory never called {FINISH} (unfinished or truncated)"
        )
    if finishes > 1:
        return _fail("several_final_answers", f"{FINISH} was called {finishes} times")
    if names[-1] != FINISH:
        return _fail("finish_not_last", f"a tool was called after {FINISH}")
    last = calls[-1]
    if strip_end_markers(text[last.end :]):
        return _fail("text_after_finish", f"the model kept writing after {FINISH}")
    assert last.call is not None
    return FormatVerdict(True, answer=str(last.call.arguments["answer"]))
