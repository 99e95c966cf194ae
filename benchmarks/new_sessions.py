"""New sessions at 1,024 busy sessions on one core: how long a new connection waits for its
first answer, this tree beside BASELINE (62c9c25, whose accept loop answered them within 1 s).

    python -m benchmarks.new_sessions [--rounds 4] [--seconds 15] [--baseline REF]

Each tree's tool server alone on core 0 (one process), the fake upstream (50 ms), wrk and the
probe on core 1. wrk holds 1,024 sessions of the mixed load back to back (search -> click, half
the queries repeating); meanwhile the probe (benchmarks/accept_probe.py) opens one new
connection every 0.25 s and times connect -> first byte of its first call, and at the start
opens 64 more together with wrk's 1,024: the first call of a session arriving with the load. The trees run in
turn, round after round, the order alternating. Part of `make bench`; writes
benchmarks/results/new_sessions.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from benchmarks.baseline import ROOT, baseline_tree
from benchmarks.harness import cpu_seconds, require_tool
from benchmarks.side_by_side import accept_run, percentile, upstream_and_tool_servers
from benchmarks.tool_server import UPSTREAM_LATENCY_S

BASELINE = "62c9c25"  # the last commit with an accept loop of our own, before issue 27's regression
SESSIONS = 1024
# one new connection every PROBE_INTERVAL_S, answered within ANSWERED_S: the goal
PROBE_WAVE = 1
PROBE_INTERVAL_S = 0.25
ANSWERED_S = 1.0
BURST = 64  # sessions opened with wrk's at the start of a run
SIDES = ("baseline", "now")


def measure(baseline: str, rounds: int, seconds: int) -> dict[str, Any]:
    require_tool("wrk", "wrk", "new-sessions")  # before the baseline's tree is made
    trees = {"baseline": baseline_tree(baseline), "now": ROOT}
    results: dict[str, Any] = {
        "baseline": baseline,
        "sessions": SESSIONS,
        "upstream_latency_ms": UPSTREAM_LATENCY_S * 1000,
        "probe": {"wave": PROBE_WAVE, "interval_s": PROBE_INTERVAL_S},
        "pairs": [],
    }
    with upstream_and_tool_servers(trees) as servers:
        for round_number in range(rounds):
            order = SIDES if round_number % 2 == 0 else tuple(reversed(SIDES))
            pair: dict[str, Any] = {"round": round_number, "first": order[0]}
            for side in order:
                pid, base = servers[side]
                before = cpu_seconds(pid)
                run = accept_run(
                    pid,
                    base,
                    seconds,
                    0,
                    SESSIONS,
                    wave=PROBE_WAVE,
                    interval_s=PROBE_INTERVAL_S,
                    answered_ms=ANSWERED_S * 1000,
                    burst=BURST,
                )
                run["server_cpu_s"] = round(cpu_seconds(pid) - before, 2)
                pair[side] = run
            results["pairs"].append(pair)
            show(pair, baseline)
    results["summary"] = summary(results["pairs"])
    return results


def show(pair: dict[str, Any], baseline: str) -> None:
    for side in SIDES:
        run = pair[side]
        print(
            f"round {pair['round']} {baseline if side == 'baseline' else 'now':>8}: "
            f"{run['calls_per_s']:>5.0f} calls/s, {run['server_cpu_ms_per_call']} ms CPU/call; "
            f"new connections' first byte p50 {run['first_byte_p50_ms']} / p99 "
            f"{run['first_byte_p99_ms']} ms, {run['answered_within']:.0%} within "
            f"{ANSWERED_S:.0f} s ({run['probes']} probes, {run['failed']} failed); first call "
            f"of {BURST} opened with wrk's p50 {run['burst_p50_ms']} / p99 {run['burst_p99_ms']} "
            f"ms; existing sessions p50 {run['existing_sessions_p50_ms']} ms; accept queue mean "
            f"{run['accept_queue_mean']} max {run['accept_queue_max']}",
            flush=True,
        )


def summary(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each side's median over the pairs, and the probes of all pairs pooled."""
    keys = (
        "calls_per_s",
        "server_cpu_ms_per_call",
        "first_byte_p50_ms",
        "first_byte_p99_ms",
        "answered_within",
        "existing_sessions_p50_ms",
        "existing_sessions_p99_ms",
        "burst_p50_ms",
        "burst_p99_ms",
    )
    out: dict[str, Any] = {}
    for side in SIDES:
        runs = [p[side] for p in pairs]
        medians = {
            key: round(float(statistics.median(r[key] for r in runs if r[key] is not None)), 3)
            for key in keys
            if any(r[key] is not None for r in runs)
        }
        times = sorted(t for r in runs for t in r["first_byte_ms"])
        burst = sorted(t for r in runs for t in r["burst_first_byte_ms"])
        pooled = {
            "probes": len(times),
            "failed": sum(t == float("inf") for t in times),
            "p50_ms": percentile(times, 0.5),
            "p99_ms": percentile(times, 0.99),
            "within": round(sum(t <= ANSWERED_S * 1000 for t in times) / max(1, len(times)), 3),
            "burst_sessions": len(burst),
            "burst_p50_ms": percentile(burst, 0.5),
            "burst_p99_ms": percentile(burst, 0.99),
        }
        out[side] = {"medians": medians, "pooled": pooled}
    return out


def run(baseline: str = BASELINE, rounds: int = 4, seconds: int = 15) -> dict[str, Any]:
    """The benchmark as `make bench` runs it."""
    return measure(baseline, rounds, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--baseline", default=BASELINE, metavar="REF")
    args = parser.parse_args()
    results = run(args.baseline, args.rounds, args.seconds)
    out = ROOT / "benchmarks" / "results" / "new_sessions.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
