"""Why the tool server accepts connections with uvicorn's own listener (docs/services.md): this
tree against ACCEPT_ALL_COMMIT, the last one with an accept loop of our own (every pending
connection taken on each loop pass), at one worker's share of a node's sessions.

    python -m benchmarks.accept_choice [--rounds 3] [--seconds 15] [--against COMMIT]

Each tree's tool server alone on core 0 (one process), the fake upstream, wrk and the probe on
core 1; in each round, both trees in turn (the order alternates), with and without think time:
wrk holds the sessions, waves of new sessions (benchmarks/accept_probe.py: 32 every 0.25 s) time
connect -> first byte. Prints each pair and the per-pair ratios; writes
benchmarks/results/accept_choice.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.baseline import ROOT, baseline_tree
from benchmarks.harness import cpu_seconds, free_port, pinned, process, python_module
from benchmarks.side_by_side import (
    GROUP,
    NODE_WORKERS,
    accept_run,
    busiest_worker_share,
    tree_env,
)
from benchmarks.tool_server import UPSTREAM_LATENCY_S, tool_server_command, write_corpus

ACCEPT_ALL_COMMIT = "29f399f"
SESSIONS = 1024  # a node's sessions; each tree serves the busiest worker's share of them
THINK_MS = (500, 0)
RESULTS = Path(__file__).with_name("results") / "accept_choice.json"


def measure(against: str, rounds: int, seconds: int) -> dict[str, Any]:
    trees = {"accept_all": baseline_tree(against), "uvicorn": ROOT}
    share = busiest_worker_share(SESSIONS, GROUP, NODE_WORKERS)
    results: dict[str, Any] = {"against": against, "sessions": share, "pairs": []}
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        fake = python_module(
            "fakes.upstream", "--port", str(up_port), "--latency", str(UPSTREAM_LATENCY_S)
        )
        stack.enter_context(process(pinned(fake, core=1), f"{upstream}/stats", work / "f.log"))
        corpus = work / "corpus.jsonl"
        write_corpus(corpus)
        servers: dict[str, tuple[int, str]] = {}
        for name, tree in trees.items():
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            command = tool_server_command(port, upstream, corpus, work / f"idx-{name}")
            with contextlib.chdir(tree):
                proc = stack.enter_context(
                    process(
                        pinned(command, core=0),
                        f"{base}/health",
                        work / f"{name}.log",
                        tree_env(tree),
                    )
                )
            httpx.post(  # the query the probe asks for: cached from here on
                f"{base}/tool",
                json={
                    "session_id": "warm",
                    "name": "search",
                    "arguments": {"query": "silver orrery of haldor"},
                },
                timeout=30,
            )
            servers[name] = (proc.pid, base)
        for round_number in range(rounds):
            for think_ms in THINK_MS:
                order = list(servers) if round_number % 2 == 0 else list(reversed(servers))
                pair: dict[str, Any] = {"round": round_number, "think_ms": think_ms}
                for name in order:
                    pid, base = servers[name]
                    before = cpu_seconds(pid)
                    run = accept_run(pid, base, seconds, think_ms, share)
                    run["server_cpu_s"] = round(cpu_seconds(pid) - before, 2)
                    pair[name] = run
                results["pairs"].append(pair)
                show(pair)
    return results


def show(pair: dict[str, Any]) -> None:
    for name in ("accept_all", "uvicorn"):
        run = pair[name]
        print(
            f"round {pair['round']} think {pair['think_ms']:>3} ms {name:>10}: "
            f"{run['calls_per_s']:>6.0f} calls/s, new sessions' first byte p50 "
            f"{run['first_byte_p50_ms']} / p99 {run['first_byte_p99_ms']} ms, "
            f"{run['first_byte_within_100ms']:.1%} within 100 ms, accept queue mean "
            f"{run['accept_queue_mean']}, server CPU {run['server_cpu_s']} s",
            flush=True,
        )


def summary(results: dict[str, Any]) -> dict[str, Any]:
    """Per think time, the medians over the pairs of uvicorn / accept_all."""
    out = {}
    for think_ms in THINK_MS:
        pairs = [p for p in results["pairs"] if p["think_ms"] == think_ms]

        def ratio(key: str, pairs: list[dict[str, Any]] = pairs) -> float:
            ratios = [p["uvicorn"][key] / max(p["accept_all"][key], 1e-9) for p in pairs]
            return round(float(statistics.median(ratios)), 2)

        out[f"think_{think_ms}ms"] = {
            "p50_ratio": ratio("first_byte_p50_ms"),
            "p99_ratio": ratio("first_byte_p99_ms"),
            "within_100ms_ratio": ratio("first_byte_within_100ms"),
            "server_cpu_ratio": ratio("server_cpu_s"),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--against", default=ACCEPT_ALL_COMMIT)
    args = parser.parse_args()
    results = measure(args.against, args.rounds, args.seconds)
    results["ratios_uvicorn_over_accept_all"] = summary(results)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    print(json.dumps(results["ratios_uvicorn_over_accept_all"], indent=1))


if __name__ == "__main__":
    main()
