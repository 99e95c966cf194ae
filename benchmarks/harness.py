"""Process plumbing shared by the benchmarks: free ports, pinned subprocesses, readiness waits."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

CORES = os.cpu_count() or 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pinned(command: Sequence[str], core: int | None) -> list[str]:
    """Prefix `taskset -c core` when the machine has that core and taskset exists."""
    if core is None or core >= CORES or shutil.which("taskset") is None:
        return list(command)
    return ["taskset", "-c", str(core), *command]


def wait_healthy(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy in {timeout_s:.0f}s")


@contextmanager
def process(
    command: Sequence[str], health_url: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(health_url)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")
