"""What a step found: named checks, each ok, failed or skipped with why, and the lines that
say so.

A step's verdict is the conjunction of its checks and it must have at least one that was not
skipped: a step that checked nothing has not passed. One that raised is a failure carrying its
message. A skipped check (nothing to check here: the offline world has no upstream to search)
fails nothing and is never shown as "ok".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    skipped: bool = False

    def line(self) -> str:
        tag = "skipped" if self.skipped else "ok" if self.ok else "FAILED"
        return f"[{tag}] {self.name}: {self.detail}"


def failed(name: str, detail: str) -> Check:
    return Check(name, False, detail)


def passed(name: str, detail: str) -> Check:
    return Check(name, True, detail)


def skipped(name: str, why: str) -> Check:
    return Check(name, True, why, skipped=True)


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
        checked = any(not check.skipped for check in self.checks)
        return self.ran and self.error is None and checked and all(self.checks_ok())

    def checks_ok(self) -> list[bool]:
        return [check.ok for check in self.checks]

    def why(self) -> str:
        """The first reason it failed, in a few words (empty when it passed)."""
        if not self.ran:
            return "not run"
        if self.error is not None:
            return self.error
        if all(check.skipped for check in self.checks):
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
        elif self.ran and all(check.skipped for check in self.checks):
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
