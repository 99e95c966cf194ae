"""Per-trajectory state: the latest search results, so `click` can open result k.

Bounded in both directions: entries expire after `ttl_s` without use, and at most
`max_sessions` are kept (least recently used dropped first), so a 3,000-step run whose
trajectories never say goodbye cannot grow the server without bound.

A worker started to replace one that died (services/serving/workers.py) holds none of the old
worker's sessions, and the rollout goes on sending them. Such a store also remembers which
sessions it has served since it started: a session it has never seen had its state in the old
worker (`lost`), so a click there is `session_lost` (search again), not `invalid_link_id` (a
model's mistake). Only a replacement pays for that record.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetools import TTLCache

from services.base.clock import SYSTEM_CLOCK, Now
from services.tool_server.models import SearchResult


@dataclass(frozen=True)
class SessionSettings:
    max_sessions: int = 100_000
    ttl_s: float = 3600.0


class SessionStore:
    def __init__(
        self,
        settings: SessionSettings,
        clock: Now = SYSTEM_CLOCK,
        replacement: bool = False,
    ) -> None:
        self._sessions: TTLCache[str, tuple[SearchResult, ...]] = TTLCache(
            maxsize=settings.max_sessions, ttl=settings.ttl_s, timer=clock
        )
        self._seen: TTLCache[str, bool] | None = None
        if replacement:
            self._seen = TTLCache(maxsize=settings.max_sessions, ttl=settings.ttl_s, timer=clock)

    def lost(self, session_id: str) -> bool:
        """Whether this session's state was lost with the worker this one replaced: a
        replacement that has not served it yet."""
        return self._seen is not None and session_id not in self._seen

    def served(self, session_id: str) -> None:
        """A call of this session was served here (recorded by a replacement only)."""
        if self._seen is not None:
            self._seen[session_id] = True

    def __len__(self) -> int:
        self._sessions.expire()
        return len(self._sessions)

    def latest_results(self, session_id: str) -> tuple[SearchResult, ...] | None:
        return self._sessions.get(session_id)

    def remember_results(self, session_id: str, results: tuple[SearchResult, ...]) -> None:
        self._sessions[session_id] = results

    def close(self, session_id: str) -> bool:
        return self._sessions.pop(session_id, None) is not None
