"""The strict binary reward: 1 only when the format is right AND the judge says correct.

A judge that fails (down, slow, garbage) gives 0 with an error saying so, never 1. Cheap hacks
are refused before any judge is asked: an answer that repeats the question scores 0.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio

from deepdive.protocol import Failure, RewardReply, RewardRequest
from services.base.errors import DeadlineExceeded, ItemFailed
from services.base.logs import log_event
from services.reward_server.answers import repeats_question
from services.reward_server.format_check import FormatVerdict, check_format
from services.reward_server.judging import Judge, Verdict

logger = logging.getLogger("deepdive.reward_server")


@dataclass(frozen=True)
class Evaluation:
    reward: int
    format: FormatVerdict
    verdict: Verdict | None
    judge_name: str

    def as_json(self) -> dict[str, Any]:
        return self.reply().as_json()

    def reply(self) -> RewardReply:
        verdict = self.verdict
        error = verdict.error if verdict is not None else None
        return RewardReply(
            self.reward,
            format_ok=self.format.ok,
            format_reason=self.format.reason,
            answer_ok=None if verdict is None else verdict.correct,
            extracted_answer=self.format.answer,
            judge={
                "name": self.judge_name,
                "verdict": _verdict_word(verdict),
                "reason": "not judged: " + (self.format.reason or "")
                if verdict is None
                else verdict.reason,
            },
            error=None if error is None else Failure(error.code, error.message),
        )

    @property
    def outcome(self) -> str:
        """For metrics and logs: reward_1, reward_0, format_<code>, or the judge's error code."""
        if self.verdict is not None and self.verdict.error is not None:
            return self.verdict.error.code
        if not self.format.ok:
            return f"format_{self.format.code}"
        return f"reward_{self.reward}"


def _verdict_word(verdict: Verdict | None) -> str | None:
    if verdict is None or verdict.correct is None:
        return None
    return "correct" if verdict.correct else "incorrect"


class Evaluator:
    def __init__(self, judge: Judge, deadline_s: float) -> None:
        self.judge = judge
        self.deadline_s = deadline_s

    async def evaluate(self, request: RewardRequest) -> Evaluation:
        """Never raises: a bug met on this item is logged and scores it 0 with an error, so a
        batch keeps its other items' rewards and no client sees a 500."""
        try:
            return await self._evaluate(request)
        except Exception as exc:
            log_event(logger, "evaluation_failed", logging.ERROR, error=type(exc).__name__)
            logger.debug("evaluation failure details", exc_info=exc)
            error = ItemFailed("the reward server failed on this item; it scores 0")
            return Evaluation(
                0,
                FormatVerdict(False, None, error.code, error.message),
                Verdict(None, error.message, error=error),
                self.judge.name,
            )

    async def _evaluate(self, request: RewardRequest) -> Evaluation:
        verdict_format = check_format(request.trajectory)
        if verdict_format.ok and request.client_unfinished:
            verdict_format = FormatVerdict(
                False,
                verdict_format.answer,
                "client_unfinished",
                "the client reports the task unfinished or truncated",
            )
        if verdict_format.ok and request.client_format_invalid:
            verdict_format = FormatVerdict(
                False,
                verdict_format.answer,
                "client_format_invalid",
                "the client reports an invalid format",
            )
        if not verdict_format.ok or verdict_format.answer is None:
            return Evaluation(0, verdict_format, None, self.judge.name)
        answer = verdict_format.answer
        if repeats_question(answer, request.question):
            verdict = Verdict(False, "the answer repeats the question", extracted=answer)
        else:
            verdict = await self._judge(request, answer)
        return Evaluation(
            1 if verdict.correct is True else 0, verdict_format, verdict, self.judge.name
        )

    async def _judge(self, request: RewardRequest, answer: str) -> Verdict:
        try:
            with anyio.fail_after(self.deadline_s):
                return await self.judge.judge(
                    request.question, request.labels, answer, time.monotonic() + self.deadline_s
                )
        except TimeoutError:
            error = DeadlineExceeded(f"the judge took longer than {self.deadline_s:g}s")
            return Verdict(None, error.message, error=error)
