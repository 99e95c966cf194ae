"""How a fake runs as its own process (`python -m fakes.upstream ...`): uvicorn on loopback,
quietly, with a deep accept backlog so a load generator's connections are not refused."""

from __future__ import annotations

from typing import Any


def serve_fake(app: Any, port: int) -> None:
    import uvicorn

    uvicorn.run(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, backlog=4096
    )
