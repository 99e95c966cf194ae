"""Shared fixtures: the tiny corpus as a file, the anyio backend, the fake upstreams' address."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import orjson
import pytest

from tests.helpers import DOCUMENTS, Closable, Closing


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(doc) for doc in DOCUMENTS) + b"\n")
    return path


@pytest.fixture(scope="session")
def httpserver_listen_address() -> tuple[str, int]:
    """Fake upstreams listen on 127.0.0.1 (not "localhost", which may also mean ::1)."""
    return ("127.0.0.1", 0)


@pytest.fixture
async def closing() -> AsyncIterator[Closing]:
    """`client = closing(Client(...))`: closed (`aclose`) after the test, whatever it asserted,
    in the reverse order of opening. For async tests (pytest.mark.anyio)."""
    stack = AsyncExitStack()

    def close_later(thing: Closable) -> Closable:
        stack.push_async_callback(thing.aclose)
        return thing

    async with stack:
        yield close_later
