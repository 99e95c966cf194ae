"""The ready file: what a service child (`python -m services tools|reward --ready-file PATH`)
leaves for the process that started it once it listens, so the starter reads a typed record
instead of scraping the announcement its log shows people.

One writer (the child, `write_ready`) and one reader (services.base.process, `read_ready`). The
record is written whole (services.base.files), so a reader sees no file or all of it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from services.base.files import atomic_write_bytes


@dataclass(frozen=True)
class ReadyRecord:
    """urls: every worker's base URL (one for a single process), a list as cluster.json and
    `deepdive_tool_server_url` carry it; host and port: the first worker's bound address; pid:
    the process that announced (a worker server's supervisor)."""

    urls: tuple[str, ...]
    pid: int
    host: str
    port: int

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self)) + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> ReadyRecord:
        """The record `data` holds; ValueError names what is missing or of the wrong type."""
        value = orjson.loads(data)  # orjson.JSONDecodeError is a ValueError
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, got {type(value).__name__}")
        urls = value.get("urls")
        if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
            raise ValueError(f"urls: expected a list of URLs, got {urls!r}")
        fields = {"pid": int, "host": str, "port": int}
        for name, kind in fields.items():
            if not isinstance(value.get(name), kind) or isinstance(value.get(name), bool):
                raise ValueError(f"{name}: expected {kind.__name__}, got {value.get(name)!r}")
        return cls(tuple(urls), pid=value["pid"], host=value["host"], port=value["port"])


def write_ready(path: Path, record: ReadyRecord) -> None:
    atomic_write_bytes(path, record.to_json())


def read_ready(path: Path) -> ReadyRecord | None:
    """The record at `path`, None while there is none; ValueError when the file there is not
    a ready record (a writer that is not ours: ours never leaves half of one)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return ReadyRecord.from_json(data)
