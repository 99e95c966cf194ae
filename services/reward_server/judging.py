"""What a judge is, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from services.base.errors import DeepDiveError


@dataclass(frozen=True)
class Verdict:
    """`correct` is None when the judge could not decide (it failed): that never earns reward."""

    correct: bool | None
    reason: str
    extracted: str | None = None
    error: DeepDiveError | None = None


class Judge(Protocol):
    name: str

    async def judge(
        self, question: str, labels: tuple[str, ...], answer: str, deadline: float
    ) -> Verdict:
        """Is `answer` a correct answer to `question`, given the reference `labels`?"""
        ...

    def not_ready_reason(self) -> str | None: ...

    async def aclose(self) -> None: ...
