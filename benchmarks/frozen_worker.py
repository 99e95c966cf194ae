"""A tool worker frozen with SIGSTOP: how soon the supervisor finds and replaces it, how soon its
sessions' calls are answered `session_lost`, and whether the other workers serve meanwhile.

    python -m benchmarks.frozen_worker [--rounds 5] [--workers 3] [--sessions 4]

Each round starts a fresh tool server (`python -m services tools --workers W`, the default
supervision: a ping every 1 s, 3 s each, 2 misses; Serper search from the fake upstream, 50 ms,
and the offline reader), so every round's restart is the first in its minute (the backoff's
0.5 s, not a doubled one). `--sessions` sessions search and click on worker 0 and two on each
other worker; after a random 0-1 s (the ping's phase) one of worker 0's sessions calls, and the
moment its answer arrives is the worker's last answer we know of (a ping may have been answered
after it, before the SIGSTOP that follows at once: the figures from it are upper bounds). Then:
- found: the supervisor's `worker_frozen` log line (its timestamp) and `worker_restarted`;
  replaced: a GET /health sent to the frozen worker's port at the SIGSTOP (it waits in the
  kernel's queue of the socket the supervisor holds) is answered, by the replacement, whose
  /metrics then counts the restart (`tool_worker_restarts_total`);
- the frozen worker's sessions: half send a click at the SIGSTOP (in flight while it is
  frozen), half 4 s later, each through the rollout's own client (deepdive.generate.call_tool,
  30 s timeout, its retries); each then does what a model told `session_lost` does, a search
  and a click;
- the other workers' sessions call the whole time (search, click, 50 ms between calls).
Goal (issue 27): replaced within 10 s of the last answer, session_lost well before the 30 s
timeout, the other workers unaffected. Part of `make bench`; writes
benchmarks/results/frozen_worker.json (docs/benchmarks.md, docs/services.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.baseline import ROOT
from benchmarks.harness import free_port, process, python_module
from deepdive.clients import close_clients
from deepdive.generate import call_tool
from deepdive.protocol import ToolCall, ToolReply
from deepdive.rollout_settings import RolloutSettings
from services.base.process import ServiceProcess
from services.serving.supervision import SupervisionPolicy

UPSTREAM_LATENCY_S = 0.05
CLIENT_TIMEOUT_S = 30.0  # the rollout's tool timeout the issue measured
GOAL_S = 10.0  # replaced within this of its last answer
LATE_S = 4.0  # the second half of the frozen worker's sessions call this long into the freeze
OTHER_SESSIONS = 2  # per worker that is not frozen
THINK_S = 0.05  # between an other session's calls (the model's turn; the machine is 2 cores)
PAGES = 200  # the fake upstream's result links: https://bench.example/0 .. /199
SEARCH = ToolCall("search", {"query": "orrery"})
CLICK = ToolCall("click", {"link_id": 1})


def write_corpus(path: Path) -> None:
    docs = [
        {"url": f"https://bench.example/{i}", "title": f"Doc {i}", "text": f"orrery {i}"}
        for i in range(PAGES)
    ]
    path.write_bytes(b"\n".join(orjson.dumps(doc) for doc in docs) + b"\n")


@dataclass
class Served:
    """The other workers' calls during a round: each one's seconds, and those that failed."""

    seconds: list[float] = field(default_factory=list)
    failed: int = 0


async def tool(settings: RolloutSettings, url: str, session: str, call: ToolCall) -> ToolReply:
    return await call_tool(settings, url, session, call, ())


async def lost_calls(
    settings: RolloutSettings, url: str, session: str, delay_s: float, stop_at: float
) -> dict[str, Any]:
    """One of the frozen worker's sessions: a click `delay_s` after the SIGSTOP (wall clock
    `stop_at`), then what a model told `session_lost` does next, a search and a click; each
    one's seconds and error code (none: served)."""
    await asyncio.sleep(max(0.0, stop_at + delay_s - time.time()))
    out: dict[str, Any] = {"sent_after_stop_s": round(time.time() - stop_at, 3)}
    for name, call in (("frozen", CLICK), ("next", SEARCH), ("then", CLICK)):
        started = time.monotonic()
        reply = await tool(settings, url, session, call)
        out[f"{name}_s"] = round(time.monotonic() - started, 3)
        out[f"{name}_code"] = reply.error.code if reply.error is not None else None
    return out


async def other_sessions(
    settings: RolloutSettings, urls: list[str], done: asyncio.Event, served: Served
) -> None:
    async def one(url: str, session: str) -> None:
        while not done.is_set():
            for call in (SEARCH, CLICK):
                started = time.monotonic()
                reply = await tool(settings, url, session, call)
                served.seconds.append(time.monotonic() - started)
                served.failed += reply.error is not None
                await asyncio.sleep(THINK_S)

    await asyncio.gather(
        *(one(url, f"other-{k}-{n}") for k, url in enumerate(urls) for n in range(OTHER_SESSIONS))
    )


async def freeze_once(
    settings: RolloutSettings, urls: list[str], victim: int, sessions: int, phase_s: float
) -> dict[str, Any]:
    """SIGSTOP worker 0 (pid `victim`) after its sessions have searched and clicked; what
    follows, on the wall clock (the log's) and in seconds."""
    frozen_url, others = urls[0], urls[1:]
    names = [f"lost-{n}" for n in range(sessions)]
    for name in names:
        for call in (SEARCH, CLICK):
            reply = await tool(settings, frozen_url, name, call)
            assert reply.error is None, reply
    done = asyncio.Event()
    served = Served()
    load = asyncio.create_task(other_sessions(settings, others, done, served))
    await asyncio.sleep(phase_s)
    reply = await tool(settings, frozen_url, names[0], CLICK)  # the last answer we know of
    last_answer = time.time()
    os.kill(victim, signal.SIGSTOP)
    stop_at = time.time()
    assert reply.error is None, reply
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) as probe:
        health = asyncio.create_task(probe.get(f"{frozen_url}/health"))  # queued in the kernel
        calls = [
            asyncio.create_task(
                lost_calls(settings, frozen_url, name, 0.0 if n < sessions / 2 else LATE_S, stop_at)
            )
            for n, name in enumerate(names)
        ]
        answered = await health
        replacement_answered = time.time()
        metrics = (await probe.get(f"{frozen_url}/metrics")).text
        lost = await asyncio.gather(*calls)
    done.set()
    await load
    restarts = [
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("deepdive_tool_worker_restarts_total")
    ]
    return {
        "last_answer": last_answer,
        "stop_at": stop_at,
        "phase_s": round(phase_s, 3),
        "health_status": answered.status_code,
        "replacement_answered": replacement_answered,
        "restarts_counted": restarts[0] if restarts else None,
        "calls": lost,
        "others_calls": len(served.seconds),
        "others_failed": served.failed,
        "others_p50_ms": round(statistics.median(served.seconds) * 1000, 1),
        "others_max_ms": round(max(served.seconds) * 1000, 1),
    }


def logged_at(log: Path, event: str) -> float | None:
    """The wall-clock time of the first `event` line in a service log (logging's own stamp,
    `2026-12-06 21:45:59,329`, local time)."""
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) > 4 and parts[4] == event:
            stamp = datetime.strptime(f"{parts[0]} {parts[1]}", "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


def worker_pid(log: Path, index: int, timeout_s: float = 30.0) -> int:
    """Worker `index`'s pid from its start-up line (written up to 0.1 s after it serves)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if f" worker_started worker={index} " in line:
                return int(line.split(" pid=", 1)[1].split()[0])
        time.sleep(0.05)
    raise RuntimeError(f"no start-up line of worker {index} in {log}")


def one_round(
    work: Path, upstream: str, number: int, workers: int, sessions: int
) -> dict[str, Any]:
    corpus = work / "corpus.jsonl"
    log = work / f"tools-{number}.log"
    arguments = [
        "tools", "--workers", str(workers), "--search", "serper", "--serper.base-url", upstream,
        "--reader", "offline", "--corpus", str(corpus), "--index-cache", "false",
        "--log-level", "INFO",
    ]  # fmt: skip
    key = {"SERPER_API_KEY": "bench-key-not-secret"}
    server = ServiceProcess("tools", arguments, log, ready_timeout_s=120, environment=key)
    phase_s = random.Random(number).uniform(0.0, 1.0)
    victim = 0
    with server:
        victim = worker_pid(log, 0)
        settings = RolloutSettings(
            sglang_url="http://127.0.0.1:9",
            tool_server_url=(tuple(server.urls),),
            reward_server_url=("http://127.0.0.1:9",),
            tool_timeout_s=CLIENT_TIMEOUT_S,
        )

        async def measure() -> dict[str, Any]:
            try:
                return await freeze_once(settings, server.urls, victim, sessions, phase_s)
            finally:
                await close_clients()

        try:
            raw = asyncio.run(measure())
        finally:
            with suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)  # only if it was never killed: stop can end it
    frozen_at, restarted_at = logged_at(log, "worker_frozen"), logged_at(log, "worker_restarted")
    if frozen_at is None or restarted_at is None:
        raise RuntimeError(f"round {number}: the supervisor never named the frozen worker ({log})")
    last, stop = raw.pop("last_answer"), raw.pop("stop_at")
    replaced = raw.pop("replacement_answered")
    return {
        "round": number,
        "found_after_last_answer_s": round(frozen_at - last, 3),
        "found_after_stop_s": round(frozen_at - stop, 3),
        "restarted_after_last_answer_s": round(restarted_at - last, 3),
        "replaced_after_last_answer_s": round(replaced - last, 3),
        "stop_after_last_answer_s": round(stop - last, 4),
        **raw,
    }


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def spread(values: list[float]) -> dict[str, float]:
        return {
            "median": round(statistics.median(values), 3),
            "max": round(max(values), 3),
            "min": round(min(values), 3),
        }

    calls = [call for r in rounds for call in r["calls"]]
    in_flight = [c["frozen_s"] for c in calls if c["sent_after_stop_s"] < LATE_S / 2]
    late = [c["frozen_s"] for c in calls if c["sent_after_stop_s"] >= LATE_S / 2]
    lost = [c["frozen_code"] for c in calls]
    replaced = spread([r["replaced_after_last_answer_s"] for r in rounds])
    return {
        "found_after_last_answer_s": spread([r["found_after_last_answer_s"] for r in rounds]),
        "found_after_stop_s": spread([r["found_after_stop_s"] for r in rounds]),
        "restarted_after_last_answer_s": spread(
            [r["restarted_after_last_answer_s"] for r in rounds]
        ),
        "replaced_after_last_answer_s": replaced,
        "in_flight_session_lost_s": spread(in_flight),
        "late_session_lost_s": spread(late) if late else None,
        "next_call_s": spread([c["next_s"] for c in calls]),
        "calls_session_lost": sum(code == "session_lost" for code in lost),
        "calls": len(lost),
        "next_calls_served": sum(c[f"{k}_code"] is None for c in calls for k in ("next", "then")),
        "next_calls": 2 * len(calls),
        "others_calls": sum(r["others_calls"] for r in rounds),
        "others_failed": sum(r["others_failed"] for r in rounds),
        "others_max_ms": max(r["others_max_ms"] for r in rounds),
        "goal_s": GOAL_S,
        "goal_met": replaced["max"] <= GOAL_S
        and all(code == "session_lost" for code in lost)
        and all(c[f"{k}_code"] is None for c in calls for k in ("next", "then"))
        and sum(r["others_failed"] for r in rounds) == 0,
    }


def run(rounds: int = 5, workers: int = 3, sessions: int = 4) -> dict[str, Any]:
    """The benchmark as `make bench` runs it."""
    if workers < 2 or sessions < 1:
        raise ValueError("the benchmark needs 2 workers or more and 1 session or more")
    policy = SupervisionPolicy()
    results: dict[str, Any] = {
        "workers": workers,
        "sessions": sessions,
        "other_sessions_per_worker": OTHER_SESSIONS,
        "upstream_latency_ms": UPSTREAM_LATENCY_S * 1000,
        "client_timeout_s": CLIENT_TIMEOUT_S,
        "ping_interval_s": policy.ping_interval_s,
        "ping_timeout_s": policy.ping_timeout_s,
        "missed_pings": policy.missed_pings,
        "design_bound_s": policy.found_within_s,
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="deepdive-frozen-") as tmp:
        work = Path(tmp)
        write_corpus(work / "corpus.jsonl")
        port = free_port()
        upstream = f"http://127.0.0.1:{port}"
        fake = python_module(
            "fakes.upstream", "--port", str(port), "--latency", str(UPSTREAM_LATENCY_S)
        )
        with process(fake, f"{upstream}/stats", work / "fake.log"):
            for number in range(rounds):
                result = one_round(work, upstream, number, workers, sessions)
                results["rounds"].append(result)
                show(result)
    results["summary"] = summary(results["rounds"])
    return results


def show(result: dict[str, Any]) -> None:
    calls = result["calls"]
    print(
        f"round {result['round']}: found {result['found_after_last_answer_s']:.2f} s after the "
        f"last answer ({result['found_after_stop_s']:.2f} s after SIGSTOP), replacement "
        f"answering {result['replaced_after_last_answer_s']:.2f} s; the frozen worker's calls: "
        + ", ".join(f"{c['frozen_s']:.2f} s {c['frozen_code']}" for c in calls)
        + f"; their next search {max(c['next_s'] for c in calls):.3f} s at most, "
        f"{sum(c['next_code'] is None and c['then_code'] is None for c in calls)} of "
        f"{len(calls)} served with the click after it; other workers "
        f"{result['others_calls']} calls, {result['others_failed']} failed, max "
        f"{result['others_max_ms']:.0f} ms",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--sessions", type=int, default=4, help="on the worker that freezes")
    args = parser.parse_args()
    results = run(args.rounds, args.workers, args.sessions)
    out = ROOT / "benchmarks" / "results" / "frozen_worker.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
