"""Fixtures of the rollout tests: the real tool and reward servers on loopback, and closing
the rollout's pooled clients after each test (they belong to the test's event loop)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from deepdive.clients import close_clients
from tests.helpers import reward_app, serve_in_thread, tool_app


@pytest.fixture
async def rollout_clients() -> AsyncIterator[None]:
    yield
    await close_clients()


@pytest.fixture
def services(corpus_file: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    with (
        serve_in_thread(tool_app(corpus_file, tmp_path)) as tools,
        serve_in_thread(reward_app()) as reward,
    ):
        yield {"tools": tools, "reward": reward}
