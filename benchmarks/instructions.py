"""Instructions, not seconds: this checkout against another commit (2a5d2bd unless `--baseline
REF`) under valgrind's callgrind, which counts the instructions a process executes (Ir).
Timing pairs on the shared 2-core machine spread by ±20 %, so a 7 % difference cannot be seen
in them; an instruction count does not depend on the machine's load and repeats within ~1 %.
Not part of `make bench` (needs valgrind and the baseline's worktree, ~10 min):
`python -m benchmarks --only instructions [--baseline REF]`.

Each figure is the difference of two run lengths, each a fresh process, so start-up, imports,
warm-up and exit cancel, divided by what the longer run did more; PYTHONHASHSEED=0 in both:

  rollout       benchmarks/rollout_driver.py under callgrind on core 0 (the instant fakes of
                fakes/rollout_servers.py natively on core 1), 64 episodes of 16 turns, the
                byte tokenizer: Ir(3 batches) - Ir(1 batch), per turn of the 2 batches more
  tool server   the tool server (one process, a small corpus, a fresh index cache) under
                callgrind on core 0, the fake Serper (50 ms) natively on core 1, this process
                on core 1 sending new-query searches (every one a miss, each in a session of
                its own) with 64 in flight: Ir(500 calls) - Ir(100), per call of the 400 more

Both trees in turn, REPEATS times over; the ratio is now / baseline (above 1: today's code
executes more), each repetition's and their median. valgrind missing is an error naming the
package (`apt-get install valgrind`), never a skipped part.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.baseline import ROOT, baseline_tree, has_config_options, has_workers_option
from benchmarks.harness import (
    free_port,
    pinned,
    process,
    python_module,
    require_tool,
    rollout_fakes,
    wait_healthy,
)
from benchmarks.tool_server import UPSTREAM_LATENCY_S, tool_server_command
from services.base.process import terminate

BASELINE = "2a5d2bd"  # issues 27 and 30: today's code against main before the hooks' split
SIDES = ("baseline", "this")
PARTS = ("rollout", "tools")  # what `--parts` chooses from
REPEATS = 2
ROLLOUT_SAMPLES = 64
ROLLOUT_TURNS = 16
ROLLOUT_BATCHES = (1, 3)  # after the driver's own warm-up batch of 8
TOOL_CALLS = (100, 500)
TOOL_CONCURRENCY = 64
TOOL_CORPUS_DOCS = 200  # no big page: the misses never read the corpus, its index is start-up
VALGRIND_HINT = "apt-get install valgrind"
# valgrind runs everything ~50x slower: a server's start and a graceful exit take a while
START_TIMEOUT_S = 600.0
EXIT_TIMEOUT_S = 300.0
_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)


def valgrind() -> str:
    """valgrind's path; an error naming the package when it is missing."""
    return require_tool("valgrind", "valgrind", "instructions")


def callgrind(out: Path, command: list[str]) -> list[str]:
    """`command` under callgrind, its instruction count written to `out`."""
    return [valgrind(), "--tool=callgrind", f"--callgrind-out-file={out}", *command]


def instructions(out: Path) -> int:
    """The Ir total of a callgrind output file."""
    if not out.is_file():
        raise RuntimeError(f"callgrind wrote no {out} (the process did not exit cleanly)")
    match = _TOTALS.search(out.read_bytes())
    if match is None:
        raise RuntimeError(f"{out} holds no instruction total")
    return int(match.group(1))


def tree_env(tree: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "SERPER_API_KEY": "bench-key-not-secret",
        "PYTHONPATH": str(tree),
        "PYTHONHASHSEED": "0",
    }
    env.pop("DEEPDIVE_SERVICE_TOKEN", None)
    return env


@contextmanager
def on_core(core: int) -> Iterator[None]:
    """This process on `core` (where the machine has it) for the block."""
    if not hasattr(os, "sched_getaffinity") or core >= (os.cpu_count() or 1):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def rollout_run(tree: Path, url: str, batches: int, work: Path) -> dict[str, Any]:
    """One driver run under callgrind: its JSON line and its instruction count."""
    out = work / f"rollout-{tree.name}-{batches}-{time.monotonic_ns()}.out"
    driver = Path(__file__).with_name("rollout_driver.py")
    command = [sys.executable, str(driver), str(tree), url, str(ROLLOUT_SAMPLES)]
    completed = subprocess.run(
        callgrind(out, [*command, str(ROLLOUT_TURNS), "byte", str(batches)]),
        capture_output=True,
        text=True,
        check=True,
        timeout=1200,
        env=tree_env(tree),
    )
    result: dict[str, Any] = orjson.loads(completed.stdout.strip().splitlines()[-1])
    if result["digest"] == "batches differ" or result["completed"] != ROLLOUT_SAMPLES:
        raise RuntimeError(f"{tree}: the driver's batches differ or did not complete: {result}")
    result["ir"] = instructions(out)
    out.unlink()
    return result


def rollout(trees: dict[str, Path]) -> dict[str, Any]:
    short, long = ROLLOUT_BATCHES
    repeats: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        work = Path(tmp)
        with rollout_fakes(work, ROLLOUT_TURNS) as url:
            for _ in range(REPEATS):
                repeat: dict[str, Any] = {}
                for side, tree in trees.items():
                    runs = [rollout_run(tree, url, count, work) for count in (short, long)]
                    turns = runs[1]["turns"] * (long - short)  # every batch the same samples
                    repeat[side] = {
                        "ir": [run["ir"] for run in runs],
                        "turns": turns,
                        "ir_per_unit": round((runs[1]["ir"] - runs[0]["ir"]) / turns),
                        "digest": runs[1]["digest"],
                    }
                repeats.append(repeat)
    summary = summarise(repeats, "turn")
    summary["identical_samples"] = all(
        r["baseline"]["digest"] == r["this"]["digest"] for r in repeats
    )
    summary["seconds"] = round(time.monotonic() - started)
    return summary


async def misses(base: str, calls: int) -> int:
    """`calls` searches of new queries, TOOL_CONCURRENCY in flight; the failed ones."""
    sent = 0
    failed = 0
    limits = httpx.Limits(max_connections=TOOL_CONCURRENCY)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as client:

        async def worker() -> None:
            nonlocal sent, failed
            while sent < calls:
                k = sent
                sent += 1
                body = {
                    "session_id": f"miss-{k:06d}",
                    "name": "search",
                    "arguments": {"query": f"query {k:06d} of the miss load"},
                }
                reply = await client.post("/tool", json=body)
                if reply.status_code != 200 or b'"error":{' in reply.content:
                    failed += 1

        await asyncio.gather(*(worker() for _ in range(TOOL_CONCURRENCY)))
    return failed


def write_small_corpus(path: Path) -> None:
    docs = (
        {
            "url": f"https://bench.example/{i}",
            "title": f"Document {i}",
            "text": f"Text of document {i} about orreries.",
        }
        for i in range(TOOL_CORPUS_DOCS)
    )
    path.write_bytes(b"\n".join(orjson.dumps(d) for d in docs) + b"\n")


def tool_run(tree: Path, calls: int, work: Path) -> int:
    """A fresh fake Serper and a fresh tool server of `tree` under callgrind, `calls` misses,
    a graceful exit: the server's instruction count."""
    run = work / f"{tree.name}-{calls}-{time.monotonic_ns()}"
    run.mkdir()
    corpus = run / "corpus.jsonl"
    write_small_corpus(corpus)
    up_port, port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    fake = pinned(
        python_module(
            "fakes.upstream", "--port", str(up_port), "--latency", str(UPSTREAM_LATENCY_S)
        ),
        core=1,
    )
    server_command = tool_server_command(
        port,
        upstream,
        corpus,
        run / "idx",
        workers=has_workers_option(tree),
        config_options=has_config_options(tree),
    )
    out = run / "callgrind.out"
    with (
        process(fake, f"{upstream}/stats", run / "fake.log"),
        (run / "server.log").open("wb") as log,
    ):
        server = subprocess.Popen(
            pinned(callgrind(out, server_command), core=0),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=tree_env(tree),
            cwd=tree,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_healthy(f"{base}/health", START_TIMEOUT_S)
            with on_core(1):
                failed = asyncio.run(misses(base, calls))
            upstream_calls = httpx.get(f"{upstream}/stats").json()["calls"]
        finally:
            terminate(server, EXIT_TIMEOUT_S)  # a graceful exit: callgrind writes its count
    if failed or upstream_calls != calls:
        raise RuntimeError(
            f"{tree}: {failed} of {calls} searches failed, {upstream_calls} reached the "
            f"upstream (every one should: see {run / 'server.log'})"
        )
    ir = instructions(out)
    shutil.rmtree(run)
    return ir


def tool_server(trees: dict[str, Path]) -> dict[str, Any]:
    short, long = TOOL_CALLS
    repeats: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        work = Path(tmp)
        for _ in range(REPEATS):
            repeat: dict[str, Any] = {}
            for side, tree in trees.items():
                irs = [tool_run(tree, calls, work) for calls in (short, long)]
                repeat[side] = {
                    "ir": irs,
                    "calls": long - short,
                    "ir_per_unit": round((irs[1] - irs[0]) / (long - short)),
                }
            repeats.append(repeat)
    summary = summarise(repeats, "call")
    summary["seconds"] = round(time.monotonic() - started)
    return summary


def spread(values: list[float]) -> float:
    """(max - min) / median: how far the repetitions of one figure lie apart."""
    return round((max(values) - min(values)) / statistics.median(values), 4)


def summarise(repeats: list[dict[str, Any]], unit: str) -> dict[str, Any]:
    ratios = [round(r["this"]["ir_per_unit"] / r["baseline"]["ir_per_unit"], 4) for r in repeats]
    summary: dict[str, Any] = {"unit": unit, "repeats": repeats, "ratios": ratios}
    for side in SIDES:
        per_unit = [r[side]["ir_per_unit"] for r in repeats]
        summary[f"{side}_ir_per_{unit}"] = round(statistics.median(per_unit))
        summary[f"{side}_spread"] = spread(per_unit)
    summary["ratio"] = round(statistics.median(ratios), 4)
    return summary


def version() -> str:
    return subprocess.run(
        [valgrind(), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()


def run(baseline: str = BASELINE, parts: tuple[str, ...] = PARTS) -> dict[str, Any]:
    """Both parts, both trees: Ir per turn and per call, and the ratios now / baseline."""
    results: dict[str, Any] = {"baseline": baseline, "valgrind": version(), "repeats": REPEATS}
    trees = {"baseline": baseline_tree(baseline), "this": ROOT}
    started = time.monotonic()
    if "rollout" in parts:
        results["rollout"] = {
            "samples": ROLLOUT_SAMPLES,
            "turns": ROLLOUT_TURNS,
            "batches": list(ROLLOUT_BATCHES),
            **rollout(trees),
        }
    if "tools" in parts:
        results["tool_server"] = {
            "calls": list(TOOL_CALLS),
            "concurrency": TOOL_CONCURRENCY,
            **tool_server(trees),
        }
    results["seconds"] = round(time.monotonic() - started)
    return results
