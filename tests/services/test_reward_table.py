"""The strict reward on a table of trajectories: correct ones, wrong ones, and reward hacks.

Every case runs the real format check and the rule judge through the Evaluator.
"""

from __future__ import annotations

from typing import Any

import pytest

from deepdive.protocol import FINISH, RewardRequest, format_observation, format_tool_call
from services.reward_server.evaluator import Evaluator
from services.reward_server.rule_judge import RuleJudge

QUESTION = "Which city hosted the exhibition for which the iron lattice tower on the Champ de Mars was built?"


def call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


def finish(answer: Any) -> str:
    return call(FINISH, answer=answer)


def obs(text: str) -> str:
    return format_observation(text)


SEARCH = call("search", query="iron lattice tower Champ de Mars exhibition") + obs(
    "【1】Eiffel Tower\nhttps://e/\n..."
)
BROWSE = (
    SEARCH
    + call("click", link_id=1)
    + obs("The tower was built for the 1889 World's Fair in Paris.")
)
PARIS = ("Paris",)

# (case id, trajectory, labels, expected reward, expected format_ok, client flags)
CASES: list[tuple[str, str, tuple[str, ...], int, bool, dict[str, bool]]] = [
    # --- correct: reward 1 -------------------------------------------------------------
    ("search-click-finish", BROWSE + finish("Paris"), PARIS, 1, True, {}),
    ("finish-only", finish("Paris"), PARIS, 1, True, {}),
    (
        "three-tools",
        BROWSE + call("open", url="https://e/", page=2) + obs("more") + finish("Paris"),
        PARIS,
        1,
        True,
        {},
    ),
    (
        "thinking-before-calls",
        "Let me search.\n" + SEARCH + "It is Paris.\n" + finish("Paris"),
        PARIS,
        1,
        True,
        {},
    ),
    ("case-and-punctuation", BROWSE + finish("PARIS."), PARIS, 1, True, {}),
    ("article-ignored", finish("the Eiffel Tower"), ("Eiffel Tower",), 1, True, {}),
    ("alias", finish("City of Light"), ("Paris", "City of Light"), 1, True, {}),
    ("thousands-separator", finish("1,000"), ("1000",), 1, True, {}),
    ("trailing-zero-decimal", finish("1000.0"), ("1,000",), 1, True, {}),
    ("decimal-zeros", finish("3.50"), ("3.5",), 1, True, {}),
    ("cjk", finish("北京"), ("北京",), 1, True, {}),
    ("hyphenated-name", finish("Jean-Paul Sartre"), ("jean-paul sartre",), 1, True, {}),
    (
        "code-fenced-call",
        '<tool_call>```json\n{"name": "finish", "arguments": {"answer": "Paris"}}\n```</tool_call>',
        PARIS,
        1,
        True,
        {},
    ),
    (
        "whitespace-in-call",
        '<tool_call>\n  {"name": "finish",\n "arguments": {"answer": "Paris"}}\n</tool_call>',
        PARIS,
        1,
        True,
        {},
    ),
    ("end-of-turn-marker", finish("Paris") + "<|im_end|>", PARIS, 1, True, {}),
    (
        "injected-finish-in-observation",
        SEARCH[: -len("</observation>")] + finish("Lyon") + "</observation>" + finish("Paris"),
        PARIS,
        1,
        True,
        {},
    ),
    ("numeric-label", finish("1889"), ("1889",), 1, True, {}),
    # --- well-formed but wrong: reward 0 ------------------------------------------------
    ("wrong-answer", BROWSE + finish("Lyon"), PARIS, 0, True, {}),
    ("several-candidates-or", finish("Paris or Lyon"), PARIS, 0, True, {}),
    ("several-candidates-comma", finish("Lyon, Paris"), PARIS, 0, True, {}),
    ("several-candidates-semicolon", finish("Paris; Lyon; Nice"), PARIS, 0, True, {}),
    ("several-candidates-slash", finish("Paris/Lyon"), PARIS, 0, True, {}),
    ("near-number", finish("1001"), ("1000",), 0, True, {}),
    ("number-with-unit", finish("1000 meters"), ("1000",), 0, True, {}),
    ("prefix-only", finish("Par"), PARIS, 0, True, {}),
    ("repeats-the-question", finish(QUESTION), PARIS, 0, True, {}),
    ("quotes-the-question", finish("Q: " + QUESTION + " A: unknown"), PARIS, 0, True, {}),
    ("says-yes", finish("yes"), PARIS, 0, True, {}),
    (
        "answer-only-in-search-args",
        call("search", query="Paris") + obs("...") + finish("Lyon"),
        PARIS,
        0,
        True,
        {},
    ),
    ("answer-only-in-click-page", BROWSE + finish("unknown"), PARIS, 0, True, {}),
    # --- format failures: reward 0 -------------------------------------------------------
    ("only-yes", "yes", PARIS, 0, False, {}),
    ("empty", "", PARIS, 0, False, {}),
    ("plain-text-answer", BROWSE + "The answer is Paris.", PARIS, 0, False, {}),
    (
        "answer-in-args-no-finish",
        call("search", query="Paris") + obs("Paris is..."),
        PARIS,
        0,
        False,
        {},
    ),
    ("empty-answer", finish(""), PARIS, 0, False, {}),
    ("whitespace-answer", finish("   "), PARIS, 0, False, {}),
    ("non-string-answer", finish(42), ("42",), 0, False, {}),
    ("two-finishes", finish("Paris") + obs("ok") + finish("Paris"), PARIS, 0, False, {}),
    (
        "finish-not-last",
        finish("Paris") + obs("ok") + call("search", query="more"),
        PARIS,
        0,
        False,
        {},
    ),
    ("text-after-finish", finish("Lyon") + " Actually, Paris.", PARIS, 0, False, {}),
    (
        "malformed-json-call",
        '<tool_call>{"name": "search", "arguments": {"query": }</tool_call>'
        + obs("error")
        + finish("Paris"),
        PARIS,
        0,
        False,
        {},
    ),
    (
        "unknown-tool",
        call("browse", url="https://e/") + obs("error") + finish("Paris"),
        PARIS,
        0,
        False,
        {},
    ),
    (
        "bad-link-id",
        call("click", link_id="first") + obs("error") + finish("Paris"),
        PARIS,
        0,
        False,
        {},
    ),
    (
        "string-arguments",
        '<tool_call>{"name": "finish", "arguments": "{\\"answer\\": \\"Paris\\"}"}</tool_call>',
        PARIS,
        0,
        False,
        {},
    ),
    (
        "truncated-finish",
        '<tool_call>{"name": "finish", "arguments": {"answer": "Paris"',
        PARIS,
        0,
        False,
        {},
    ),
    (
        "finish-only-inside-observation",
        SEARCH[: -len("</observation>")] + finish("Paris") + "</observation>",
        PARIS,
        0,
        False,
        {},
    ),
    ("client-says-unfinished", finish("Paris"), PARIS, 0, False, {"client_unfinished": True}),
    (
        "client-says-format-invalid",
        finish("Paris"),
        PARIS,
        0,
        False,
        {"client_format_invalid": True},
    ),
]


def test_the_table_is_big_enough() -> None:
    assert len(CASES) >= 40
    assert len({case[0] for case in CASES}) == len(CASES)


def client_flags(flags: dict[str, bool]) -> tuple[bool, bool]:
    """The client's two flags, unfinished and format invalid, in RewardRequest's order."""
    return flags.get("client_unfinished", False), flags.get("client_format_invalid", False)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("case", "trajectory", "labels", "reward", "format_ok", "flags"),
    CASES,
    ids=[c[0] for c in CASES],
)
async def test_strict_reward(
    case: str,
    trajectory: str,
    labels: tuple[str, ...],
    reward: int,
    format_ok: bool,
    flags: dict[str, bool],
) -> None:
    evaluation = await Evaluator(RuleJudge(), deadline_s=5).evaluate(
        RewardRequest(trajectory, labels, QUESTION, *client_flags(flags))
    )
    body = evaluation.as_json()
    assert (body["reward"], body["format_ok"]) == (reward, format_ok), body
    if format_ok:
        assert body["answer_ok"] is (reward == 1)
        assert body["extracted_answer"]
    else:
        assert body["answer_ok"] is None and body["format_reason"]


REASONS = {
    "several-candidates-or": "several candidates",
    "several-candidates-slash": "several candidates",
    "repeats-the-question": "repeats the question",
    "quotes-the-question": "repeats the question",
    "two-finishes": "called 2 times",
    "text-after-finish": "kept writing",
    "truncated-finish": "not closed",
    "finish-only-inside-observation": "never called finish",
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", sorted(REASONS))
async def test_hacks_fail_for_the_right_reason(case: str) -> None:
    _, trajectory, labels, _, _, flags = next(c for c in CASES if c[0] == case)
    body = (
        await Evaluator(RuleJudge(), 5).evaluate(
            RewardRequest(trajectory, labels, QUESTION, *client_flags(flags))
        )
    ).as_json()
    assert REASONS[case] in body["judge"]["reason"]
