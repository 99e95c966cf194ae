"""Process plumbing shared by the benchmarks: free ports, pinned subprocesses, readiness waits."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from services.base.errors import RuntimeFailure

CORES = os.cpu_count() or 1
LUA = Path(__file__).with_name("load.lua")
_ERROR_KEYS = (
    "connect_errors",
    "read_errors",
    "write_errors",
    "status_errors",
    "timeouts",
    "error_bodies",
)


class MissingTool(RuntimeFailure):
    """A benchmark needs a program this machine lacks: named with its package, nothing
    measured (`python -m benchmarks` prints it and exits 2)."""

    code = "missing_tool"


def require_tool(program: str, package: str, benchmark: str) -> str:
    """`program`'s path, or MissingTool naming the Debian package that brings it."""
    found = shutil.which(program)
    if found is None:
        raise MissingTool(
            f"the {benchmark} benchmark needs {program} (apt-get install {package}); "
            "nothing was measured"
        )
    return found


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


@contextmanager
def rollout_fakes(work: Path, turns: int) -> Iterator[str]:
    """fakes/rollout_servers.py (SGLang, the tool and reward servers at once, each episode
    `turns` turns) natively on core 1: its URL while it runs."""
    port = free_port()
    command = python_module("fakes.rollout_servers", "--port", str(port), "--turns", str(turns))
    url = f"http://127.0.0.1:{port}"
    with process(pinned(command, core=1), f"{url}/health", work / "fakes.log"):
        yield url


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    """A process's resident memory now, in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


def add_latency_over(result: dict[str, Any], upstream_s: float) -> None:
    """What the server adds to a call over its upstream's fixed latency, at p50 and p99."""
    result["added_p50_ms"] = round(result["p50_ms"] - upstream_s * 1000, 2)
    result["added_p99_ms"] = round(result["p99_ms"] - upstream_s * 1000, 2)


def run_wrk(
    server_pid: int, url: str, kind: str, sessions: int, seconds: int, think_ms: int = 0
) -> dict[str, Any]:
    """One wrk run of `load.lua` (on core 1) against `url`; latency, throughput, errors and the
    server's CPU time per call. Every run gets a fresh nonce, so its queries are new."""
    wrk_path = require_tool("wrk", "wrk", "wrk load")
    cpu_before = cpu_seconds(server_pid)
    nonce = uuid.uuid4().hex[:8]
    wrk = [wrk_path, "-t", "2", "-c", str(sessions), "-d", f"{seconds}s", "--timeout", "10s"]
    script = ["-s", str(LUA), url, "--", kind, nonce, str(think_ms)]
    completed = subprocess.run(
        pinned(wrk + script, core=1),
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    match = re.search(r"^RESULT (\{.*\})$", completed.stdout, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk printed no result:\n{completed.stdout}")
    raw = json.loads(match.group(1))
    cpu_ms = (cpu_seconds(server_pid) - cpu_before) * 1000
    return {
        "mode": kind if not think_ms else f"{kind}+{think_ms}ms think",
        "sessions": sessions,
        "calls_per_s": round(raw["requests"] / (raw["duration_us"] / 1e6), 1),
        "p50_ms": raw["p50_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
        "errors": sum(raw[key] for key in _ERROR_KEYS),
        "error_kinds": {key: raw[key] for key in _ERROR_KEYS if raw[key]},
        "timeouts": raw["timeouts"],
        "requests": raw["requests"],
        "server_cpu_ms_per_call": round(cpu_ms / max(1, raw["requests"]), 3),
    }
