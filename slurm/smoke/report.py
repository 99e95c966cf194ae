"""What a step found: named checks, each ok or failed with why, and the lines that say so.

A step's verdict is the conjunction of its checks and it must have at least one: a step that
checked nothing has not passed. One that raised is a failure carrying its message.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"[{'ok' if self.ok else 'FAILED'}] {self.name}: {self.detail}"


def failed(name: str, detail: str) -> Check:
    return Check(name, False, detail)


def passed(name: str, detail: str) -> Check:
    return Check(name, True, detail)


@dataclass(frozen=True)
class StepResult:
    """One node's part of one step."""

    number: int
    name: str
    node: int
    seconds: float
    checks: list[Check] = field(default_factory=list)
    error: str | None = None  # what the step raised, or why its process gave no result
    ran: bool = True  # False: not run (an earlier step failed)

    @property
    def ok(self) -> bool:
        return self.ran and self.error is None and bool(self.checks) and all(self.checks_ok())

    def checks_ok(self) -> list[bool]:
        return [check.ok for check in self.checks]

    def why(self) -> str:
        """The first reason it failed, in a few words (empty when it passed)."""
        if not self.ran:
            return "not run"
        if self.error is not None:
            return self.error
        if not self.checks:
            return "checked nothing"
        bad = [check for check in self.checks if not check.ok]
        if not bad:
            return ""
        more = f" (and {len(bad) - 1} more failed check(s))" if len(bad) > 1 else ""
        return f"{bad[0].name}: {bad[0].detail}{more}"

    def lines(self, prefix: str = "") -> list[str]:
        found = [f"{prefix}{check.line()}" for check in self.checks]
        if self.error is not None:
            found.append(f"{prefix}[FAILED] the step raised: {self.error}")
        elif self.ran and not self.checks:
            found.append(f"{prefix}[FAILED] the step checked nothing")
        return found

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> StepResult:
        checks = [Check(**check) for check in value.get("checks", [])]
        return cls(**{**value, "checks": checks})


def verdict(results: list[StepResult]) -> bool:
    return bool(results) and all(result.ok for result in results)
