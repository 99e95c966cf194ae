"""The embedded default judge: normalised exact match against the label and its aliases."""

from __future__ import annotations

from services.reward_server.answers import answers_match, candidates
from services.reward_server.judging import Verdict


class RuleJudge:
    name = "rule"

    async def judge(
        self, question: str, labels: tuple[str, ...], answer: str, deadline: float
    ) -> Verdict:
        for label in labels:
            if answers_match(answer, label):
                return Verdict(True, f"matches {label!r}", extracted=answer)
        listed = candidates(answer)
        if any(answers_match(part, label) for part in listed for label in labels):
            return Verdict(
                False, "lists several candidates instead of one answer", extracted=answer
            )
        return Verdict(False, "matches neither the reference answer nor an alias", extracted=answer)

    def not_ready_reason(self) -> str | None:
        return None

    async def aclose(self) -> None:
        return None
