"""Shared fixtures: a tiny corpus, and real uvicorn servers on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from pytest_httpserver import HTTPServer
from starlette.types import ASGIApp

from services.serve import bind, start_server_thread

FORBIDDEN_QUESTION = (
    "Which reclusive clockmaker from the valley of Vorn built the silver orrery that was "
    "later stolen from the museum in Haldor during the winter festival?"
)

DOCUMENTS = [
    {
        "url": "https://wiki.example/Orrery_of_Haldor",
        "title": "Orrery of Haldor",
        "text": "The silver orrery of Haldor is a mechanical model of the planets. "
        "It was built by the clockmaker Ilse Varen in the valley of Vorn.",
    },
    {
        "url": "https://wiki.example/Ilse_Varen",
        "title": "Ilse Varen",
        "text": "Ilse Varen was a reclusive clockmaker. She was born in Vorn and built orreries.",
    },
    {
        "url": "https://quiz.example/leak",
        "title": "Quiz answers",
        "text": "Q: " + FORBIDDEN_QUESTION + " A: Ilse Varen.",
    },
    {
        "url": "https://wiki.example/Haldor",
        "title": "Haldor",
        "text": "Haldor is a city with a famous museum. " + "The museum has many rooms. " * 120,
    },
    {
        "url": "https://blocked.example/Vorn",
        "title": "Vorn valley",
        "text": "The valley of Vorn is home to clockmakers.",
    },
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(doc) for doc in DOCUMENTS) + b"\n")
    return path


@contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[str]:
    """Run `app` under a real uvicorn on 127.0.0.1 (a free port); yield its base URL."""
    sock = bind("127.0.0.1", 0)
    stop = start_server_thread(app, sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop()


@pytest.fixture(scope="session")
def httpserver_listen_address() -> tuple[str, int]:
    """Fake upstreams listen on 127.0.0.1 (not "localhost", which may also mean ::1)."""
    return ("127.0.0.1", 0)


def wait_for_requests(server: HTTPServer, count: int, timeout_s: float = 5.0) -> None:
    """Block until a fake upstream has logged `count` requests: a slow handler that outlives
    its test would otherwise land in the next test's log."""
    deadline = time.monotonic() + timeout_s
    while len(server.log) < count and time.monotonic() < deadline:
        time.sleep(0.02)
