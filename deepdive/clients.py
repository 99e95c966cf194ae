"""One pooled HTTP client per service per process (and event loop), shared by every rollout.

DeepDive opened a new HTTP session for every tool call; at 64 turns x 1,000 samples that is
64,000 TCP handshakes per step. Here each slime rollout actor keeps one `Upstream` per service.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from services.base.secrets import TOKEN_ENV, read_secret
from services.client.http import ErrorClassifier, Upstream, UpstreamSettings
from services.client.retries import RetryPolicy

V = TypeVar("V")


class PerLoop(Generic[V]):
    """One value per event loop, weakly keyed (a finished loop takes its value along), the
    running loop's found without a weak-dictionary lookup on every call (the rollout asks on
    every turn: that lookup was ~5 % of a turn's CPU)."""

    def __init__(self, factory: Callable[[], V]) -> None:
        self._values: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, V] = (
            weakref.WeakKeyDictionary()
        )
        self._factory = factory
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], V] | None = None

    def get(self) -> V:
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1]
        value = self._values.get(loop)
        if value is None:
            value = self._values[loop] = self._factory()
        self._last = (weakref.ref(loop), value)
        return value

    def pop(self) -> V | None:
        """Forget the running loop's value (and return it)."""
        self._last = None
        return self._values.pop(asyncio.get_running_loop(), None)


# Clients belong to the event loop they were opened on; a finished loop takes its clients along.
_CLIENTS: PerLoop[dict[tuple[str, str, int], Upstream]] = PerLoop(dict)


def service_client(
    name: str,
    base_url: str,
    timeout_s: float,
    retries: int,
    classify_error: ErrorClassifier | None = None,
) -> Upstream:
    """The shared client for `name` at `base_url` on the running event loop; `classify_error`
    is the one given when the client is first made (deepdive.service_check gives our own
    services theirs)."""
    clients = _CLIENTS.get()
    key = (name, base_url, retries)
    client = clients.get(key)
    if client is None:
        token = read_secret(TOKEN_ENV)
        headers = {"Authorization": f"Bearer {token}"} if token else None
        settings = UpstreamSettings(
            base_url,
            read_timeout_s=timeout_s,
            max_concurrency=1024,
            max_response_bytes=64_000_000,
            retry=RetryPolicy(max_attempts=retries + 1, base_delay_s=0.2, max_delay_s=5.0),
            plain_http=True,  # our services and SGLang, on the cluster's network
        )
        client = Upstream(name, settings, headers=headers, classify_error=classify_error)
        clients[key] = client
    return client


async def close_clients() -> None:
    """Close this loop's clients (the local trainer calls it at exit; slime actors just exit)."""
    for client in (_CLIENTS.pop() or {}).values():
        await client.aclose()
