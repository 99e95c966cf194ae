"""A service process settles its heap before it serves (services/serving/heap.py): what startup made is
frozen, young objects are collected every 20,000 allocations, and every collection is timed
for /metrics. Checked in fresh interpreters and on a real tool server, never in the test
process (the settings are the whole process's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.base.process import ServiceProcess
from services.serving.heap import SERVICE_GC_THRESHOLDS, service_gc_thresholds

SETTLED = """
import gc, json, weakref
from services.serving.heap import settle_heap
from services.serving.metrics import ServiceMetrics

before = gc.get_threshold()
settle_heap()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: only the collector frees it
gone = weakref.ref(a)
del a, b
gc.collect()
text = ServiceMetrics("tool").render().decode()
print(json.dumps({
    "before": before,
    "after": gc.get_threshold(),
    "frozen": gc.get_freeze_count(),
    "freed": gone() is None,
    "metrics": [line for line in text.splitlines() if "_gc_" in line and not line.startswith("#")],
}))
"""


def test_settling_freezes_startup_raises_the_thresholds_and_times_collections() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SETTLED], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    seen = json.loads(out)
    expected = service_gc_thresholds()
    assert seen["after"] == (list(expected) if expected else seen["before"])
    assert seen["frozen"] > 1000  # the imported code and what it built
    assert seen["freed"]  # cycles are still collected
    full = next(m for m in seen["metrics"] if 'count{generation="2"}' in m)
    assert float(full.split()[-1]) >= 1  # the explicit collection above, timed
    assert any(m.startswith("deepdive_tool_gc_frozen_objects ") for m in seen["metrics"])


def test_an_in_process_server_leaves_the_host_process_alone() -> None:
    """The local engine and the tests serve in a thread of a process that is not theirs (a
    trainer's, pytest's): only `serve()`, a process of its own, settles the heap."""
    script = (
        "import gc, json, socket\n"
        "from services.serving.serve import bind, start_server_thread\n"
        "from starlette.applications import Starlette\n"
        "before = [gc.get_threshold(), gc.get_freeze_count()]\n"
        "stop = start_server_thread(Starlette(), bind('127.0.0.1', 0))\n"
        "stop()\n"
        "print(json.dumps([before, [gc.get_threshold(), gc.get_freeze_count()]]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    before, after = json.loads(out)
    assert after == before
    assert before[1] == 0  # nothing frozen by the host either


@pytest.mark.parametrize(
    ("version", "implementation", "expected"),
    [
        ((3, 10), "CPython", SERVICE_GC_THRESHOLDS),
        ((3, 11), "CPython", SERVICE_GC_THRESHOLDS),  # where they were measured
        ((3, 12), "CPython", SERVICE_GC_THRESHOLDS),  # slime's image: the same collector
        ((3, 13), "CPython", SERVICE_GC_THRESHOLDS),
        ((3, 14), "CPython", None),  # the incremental collector: its thresholds mean otherwise
        ((3, 11), "PyPy", None),
    ],
)
def test_the_thresholds_are_set_only_for_the_collector_they_were_measured_on(
    version: tuple[int, int], implementation: str, expected: tuple[int, int, int] | None
) -> None:
    assert service_gc_thresholds(version, implementation) == expected


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_tool_server_reports_its_settled_heap(
    corpus_file: Path, tmp_path: Path, workers: int
) -> None:
    arguments = ["tools", "--corpus", str(corpus_file), "--index-cache", "false"]
    server = ServiceProcess(
        "tools", [*arguments, "--workers", str(workers)], tmp_path / "tools.log", ready_timeout_s=60
    )
    with server:
        assert len(server.urls) == workers
        for url in server.urls:
            for n in range(50):
                httpx.post(
                    f"{url}/tool",
                    json={"session_id": f"s{n}", "name": "search", "arguments": {"query": "x"}},
                    timeout=30,
                )
            text = httpx.get(f"{url}/metrics", timeout=30).text
            frozen = next(
                line for line in text.splitlines() if line.startswith("deepdive_tool_gc_frozen")
            )
            assert float(frozen.split()[-1]) > 1000, url  # settled in each worker
            assert 'deepdive_tool_gc_pause_seconds_count{generation="0"}' in text
