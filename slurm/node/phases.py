"""Each node's phases, timestamped: what `deepdive status` shows, what the start-up benchmark
measures, and what a failure is reported against ("node 1 failed during services: ...").

A node appends JSON lines to its own file in the attempt folder (one writer per file, so no
two nodes ever append to the same file on shared storage) and echoes each as a key=value line
on its console:

    {"t": 1764590000.12, "node": 1, "attempt": "12-0", "phase": "services", "event": "start"}
    {"t": ..., "phase": "services", "event": "done", "seconds": 1.84}
    {"t": ..., "phase": "services", "event": "failed", "error": "the tool server exited ..."}
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson

from services.base.errors import RuntimeFailure
from services.base.logs import log_event, redact

logger = logging.getLogger("deepdive.job")


class NodeFailed(RuntimeFailure):
    """A node could not do its part; the message names the node and the phase."""

    code = "node_failed"

    def __init__(self, node: int, phase: str, reason: str) -> None:
        super().__init__(f"node {node} failed during {phase}: {reason}")
        self.node = node
        self.phase = phase
        self.reason = reason


class Stopping(Exception):
    """The job is ending on purpose (requeue, cancel): stop without reporting a failure."""


class PhaseLog:
    def __init__(self, path: Path, node: int, attempt: str) -> None:
        self.path = path
        self.node = node
        self.attempt = attempt
        self.current = "start"

    def record(self, phase: str, event: str, **detail: Any) -> None:
        line = {
            "t": round(time.time(), 3),
            "node": self.node,
            "attempt": self.attempt,
            "phase": phase,
            "event": event,
            **detail,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as out:
            out.write(orjson.dumps(line) + b"\n")
        log_event(logger, f"phase {phase} {event}", node=self.node, **detail)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Record the start and the end of `name`; a failure inside it becomes a NodeFailed
        that names this node and this phase (one that already names a node passes as it is)."""
        outer, self.current = self.current, name
        started = time.monotonic()
        self.record(name, "start")
        try:
            yield
        except NodeFailed as failure:
            self.record(name, "failed", error=failure.message)
            raise
        except Stopping as stop:
            self.record(name, "stopped", reason=str(stop))
            raise
        except Exception as error:
            reason = redact(getattr(error, "message", None) or f"{type(error).__name__}: {error}")
            self.record(name, "failed", error=reason)
            raise NodeFailed(self.node, name, reason) from error
        self.record(name, "done", seconds=round(time.monotonic() - started, 3))
        self.current = outer


def read_phases(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a phase file (a line being written is skipped)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = []
    for line in raw.splitlines():
        try:
            lines.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return lines


def last_phase(lines: list[dict[str, Any]]) -> str:
    """The phase a node was in at its last record (the innermost one begun and not ended)."""
    open_phases: list[str] = []
    for line in lines:
        phase, event = line.get("phase"), line.get("event")
        if phase == "job" or not isinstance(phase, str):
            continue
        if event == "start":
            open_phases.append(phase)
        elif phase in open_phases:
            open_phases.remove(phase)
    return open_phases[-1] if open_phases else "start"
