"""This checkout against another commit of main (c98b67c unless `--baseline REF`), measured in
turn, pair by pair, in one run (benchmarks/baseline.py makes the second worktree). Not part of a
plain `make bench`: `python -m benchmarks --only side_by_side [--baseline REF] [--parts ...]`.

Tool server (alone on core 0; fake Serper with 50 ms latency, wrk and the probe on core 1):
  mixed   half the searches repeat one of 64 queries, every search is followed by a click
  miss    a new query every call (every call reaches the upstream)
at 64 and 256 sessions: server CPU per call, calls/s, added p50/p99 (over the upstream's latency).
Then (part `accept`) at 1,024 sessions of the mixed load, new sessions arrive in waves
(benchmarks/accept_probe): time from connect to the first byte of their first call.
Reward server (part `reward`): the rule judge at 512 sessions of new answers.

Rollout (benchmarks/rollout_driver.py, one process on core 0; instant fakes on core 1):
CPU per turn at 64 and 256 concurrent episodes with a Hugging Face fast tokenizer, and whether
the two trees produce identical samples (tokens, masks, log-probs, text, status).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.baseline import (
    BASELINE_COMMIT,
    ROOT,
    baseline_tree,
    has_config_options,
    has_workers_option,
)
from benchmarks.harness import (
    add_latency_over,
    free_port,
    pinned,
    process,
    python_module,
    require_tool,
    rollout_fakes,
    rss_mb,
    run_wrk,
)
from benchmarks.reward_server import reward_server as reward_server_command
from benchmarks.tool_server import (
    UPSTREAM_LATENCY_S,
    run_load,
    tool_server_command,
    write_corpus,
)
from deepdive.routing import worker_index

SESSIONS = (64, 256)
ACCEPT_SESSIONS = 1024
# back to back (one saturated core), and thinking 0.5 s between calls as agents do while their
# next turn generates
ACCEPT_THINK_MS = (0, 500)
# ... and at one worker's share of them on a node of NODE_WORKERS workers: the busiest worker's
# sessions when ACCEPT_SESSIONS episodes in GRPO groups of GROUP are routed by their prompts
NODE_WORKERS = 8
GROUP = 8
ROUNDS = 2
ROLLOUT_SAMPLES = (64, 256)
ROLLOUT_TURNS = 16
ROLLOUT_ROUNDS = 3
SIDES = ("baseline", "this")
# what `--parts` chooses from: the tool server's loads, its new sessions under load, the reward
# server, the rollout's CPU per turn
PARTS = ("tools", "accept", "reward", "rollout")


def tree_env(tree: Path) -> dict[str, str]:
    env = {**os.environ, "SERPER_API_KEY": "bench-key-not-secret", "PYTHONPATH": str(tree)}
    env.pop("DEEPDIVE_SERVICE_TOKEN", None)
    return env


def tree_of(side: str, baseline: str = BASELINE_COMMIT) -> Path:
    """The side's source tree: the baseline's (a worktree made on first use), or this checkout."""
    return baseline_tree(baseline) if side == "baseline" else ROOT


def start_in_tree(
    stack: ExitStack, tree: Path, side: str, command: list[str], base: str, work: Path
) -> tuple[int, str]:
    """Start `command` (a server at `base`) from `tree`, its modules first on the path; it
    stops with `stack`. Returns (pid, base URL)."""
    with contextlib.chdir(tree):
        proc = stack.enter_context(
            process(command, f"{base}/health", work / f"{side}.log", tree_env(tree))
        )
    return proc.pid, base


@contextmanager
def tool_servers(work: Path, upstream: str, baseline: str) -> Iterator[dict[str, tuple[int, str]]]:
    """Both trees' tool servers, one process each, pinned to core 0: side -> (pid, base URL)."""
    trees = {side: tree_of(side, baseline) for side in SIDES}
    with tree_tool_servers(work, upstream, trees) as servers:
        yield servers


@contextmanager
def tree_tool_servers(
    work: Path, upstream: str, trees: dict[str, Path]
) -> Iterator[dict[str, tuple[int, str]]]:
    """A tool server per named tree, one process each, pinned to core 0, the probe's query
    cached: name -> (pid, base URL)."""
    corpus = work / "corpus.jsonl"
    write_corpus(corpus)
    servers: dict[str, tuple[int, str]] = {}
    with ExitStack() as stack:
        for side, tree in trees.items():
            port = free_port()
            command = pinned(
                tool_server_command(
                    port,
                    upstream,
                    corpus,
                    work / f"idx-{side}",
                    workers=has_workers_option(tree),
                    config_options=has_config_options(tree),
                ),
                core=0,
            )
            base = f"http://127.0.0.1:{port}"
            servers[side] = start_in_tree(stack, tree, side, command, base, work)
            httpx.post(  # the query the accept probe asks for: cached from here on
                f"{base}/tool",
                json={
                    "session_id": "warm",
                    "name": "search",
                    "arguments": {"query": "silver orrery of haldor"},
                },
                timeout=30,
            )
        yield servers


@contextmanager
def upstream_and_tool_servers(trees: dict[str, Path]) -> Iterator[dict[str, tuple[int, str]]]:
    """The fake upstream (core 1, UPSTREAM_LATENCY_S) and a tool server per tree (core 0)."""
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        work = Path(tmp)
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        fake = pinned(
            python_module(
                "fakes.upstream", "--port", str(up_port), "--latency", str(UPSTREAM_LATENCY_S)
            ),
            core=1,
        )
        with (
            process(fake, f"{upstream}/stats", work / "fake.log"),
            tree_tool_servers(work, upstream, trees) as servers,
        ):
            yield servers


def load_pair(
    servers: dict[str, tuple[int, str]], upstream: str, mode: str, sessions: int, seconds: int
) -> dict[str, dict[str, Any]]:
    pair = {}
    for side in SIDES:
        pid, base = servers[side]
        run = run_load(pid, base, upstream, mode, sessions, seconds)
        add_latency_over(run, UPSTREAM_LATENCY_S)
        pair[side] = run
    return pair


def listen_queue(port: int) -> int | None:
    """Connections the kernel has completed but the server has not accepted yet (ss's Recv-Q of
    the listening socket)."""
    if shutil.which("ss") is None:
        return None
    out = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=False
    ).stdout.split()
    return int(out[1]) if len(out) > 1 and out[1].isdigit() else None


def busiest_worker_share(sessions: int, group: int, workers: int, batches: int = 200) -> int:
    """The sessions the busiest of `workers` tool-server workers holds (the 90th percentile
    over `batches` batches of made-up prompts), routed as the rollout routes them."""
    busiest = []
    for batch in range(batches):
        counts = Counter(
            worker_index(f"prompt {batch}-{k}: who built the orrery?", workers)
            for k in range(sessions // group)
        )
        busiest.append(max(counts.values()) * group)
    return sorted(busiest)[int(0.9 * (batches - 1))]


def accept_run(
    pid: int,
    base: str,
    seconds: int,
    think_ms: int = 0,
    sessions: int = ACCEPT_SESSIONS,
    wave: int = 32,
    interval_s: float = 0.25,
    answered_ms: float = 1000.0,
    burst: int = 0,
) -> dict[str, Any]:
    """wrk holds `sessions` sessions of mixed load (each waiting `think_ms` between its calls,
    as an agent generating its next turn does); meanwhile waves of new sessions arrive (`wave`
    every `interval_s`, and `burst` more with wrk's own at the start) and the accept queue is
    sampled every 0.25 s."""
    probe_command = python_module(
        "benchmarks.accept_probe", base, str(seconds - 3), str(wave), str(interval_s), str(burst)
    )
    probe = subprocess.Popen(
        pinned(probe_command, core=1), stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    port = int(base.rsplit(":", 1)[1])
    depths: list[int] = []
    sampler_done = threading.Event()

    def sample() -> None:
        while not sampler_done.wait(0.25):
            depth = listen_queue(port)
            if depth is not None:
                depths.append(depth)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run = run_wrk(pid, f"{base}/tool", "tool-mixed", sessions, seconds, think_ms)
    finally:
        sampler_done.set()
        sampler.join()
        out, _ = probe.communicate(timeout=120)
    probed = json.loads(out.strip().splitlines()[-1])  # json: a failed probe is Infinity
    times = sorted(probed["first_byte_ms"])
    finite = [t for t in times if t != float("inf")]
    burst_times = sorted(probed["burst_first_byte_ms"])
    return {
        "sessions": sessions,
        "think_ms": think_ms,
        "calls_per_s": run["calls_per_s"],
        "server_cpu_ms_per_call": run["server_cpu_ms_per_call"],
        "existing_sessions_p50_ms": round(run["p50_ms"], 1),
        "existing_sessions_p99_ms": round(run["p99_ms"], 1),
        "errors": run["errors"],
        "probes": len(times),
        "failed": len(times) - len(finite),
        "first_byte_p50_ms": round(statistics.median(finite), 1) if finite else None,
        "first_byte_p99_ms": round(finite[int(0.99 * (len(finite) - 1))], 1) if finite else None,
        "first_byte_max_ms": round(finite[-1], 1) if finite else None,
        "first_byte_within_100ms": round(sum(t <= 100 for t in finite) / max(1, len(times)), 3),
        "answered_within": round(sum(t <= answered_ms for t in finite) / max(1, len(times)), 3),
        "first_byte_ms": times,
        "burst_first_byte_ms": burst_times,
        "burst_p99_ms": percentile(burst_times, 0.99),
        "burst_p50_ms": percentile(burst_times, 0.5),
        "accept_queue_max": max(depths) if depths else None,
        "accept_queue_mean": round(statistics.mean(depths), 1) if depths else None,
        "server_rss_mb": round(rss_mb(pid)),  # what the GC settings cost (services/serving/heap.py)
    }


def percentile(times: list[float], share: float) -> float | None:
    """The `share` percentile of sorted `times` (a failure, inf, counts as the slowest)."""
    if not times:
        return None
    value = times[int(share * (len(times) - 1))]
    return round(value, 1) if value != float("inf") else value


def ratio(before: float, after: float) -> float:
    return round(before / after, 2) if after else float("inf")


def tool_server(
    seconds: int, baseline: str = BASELINE_COMMIT, loads: bool = True, accept: bool = True
) -> dict[str, Any]:
    """The loads (`loads`) and new sessions under load (`accept`), both trees in turn."""
    require_tool("wrk", "wrk", "side-by-side")
    results: dict[str, Any] = {"baseline": baseline, "loads": [], "accept": []}
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        work = Path(tmp)
        up_port = free_port()
        upstream = f"http://127.0.0.1:{up_port}"
        fake = pinned(
            python_module(
                "fakes.upstream", "--port", str(up_port), "--latency", str(UPSTREAM_LATENCY_S)
            ),
            core=1,
        )
        with (
            process(fake, f"{upstream}/stats", work / "fake.log"),
            tool_servers(work, upstream, baseline) as servers,
        ):
            for mode in ("mixed", "miss") if loads else ():
                for sessions in SESSIONS:
                    pairs = [
                        load_pair(servers, upstream, mode, sessions, seconds) for _ in range(ROUNDS)
                    ]
                    results["loads"].append(summarise(mode, sessions, pairs))
            share = busiest_worker_share(ACCEPT_SESSIONS, GROUP, NODE_WORKERS)
            for sessions in (ACCEPT_SESSIONS, share) if accept else ():
                for think_ms in ACCEPT_THINK_MS:
                    for _ in range(ROUNDS):
                        results["accept"].append(
                            {
                                side: accept_run(*servers[side], seconds + 3, think_ms, sessions)
                                for side in SIDES
                            }
                        )
    return results


def cpu_ratios(pairs: list[dict[str, dict[str, Any]]]) -> list[float]:
    """How many times less server CPU per call this tree took than the baseline, pair by pair."""
    return [
        ratio(p["baseline"]["server_cpu_ms_per_call"], p["this"]["server_cpu_ms_per_call"])
        for p in pairs
    ]


def side_medians(pairs: list[dict[str, dict[str, Any]]], keys: tuple[str, ...]) -> dict[str, float]:
    """`<side>_<key>`: each side's median of `key` over the pairs."""
    return {
        f"{side}_{key}": round(float(statistics.median(p[side][key] for p in pairs)), 3)
        for side in SIDES
        for key in keys
    }


def summarise(mode: str, sessions: int, pairs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    ratios = cpu_ratios(pairs)
    rate_ratios = [ratio(p["this"]["calls_per_s"], p["baseline"]["calls_per_s"]) for p in pairs]
    summary: dict[str, Any] = {
        "mode": mode,
        "sessions": sessions,
        "cpu_ratio": statistics.median(ratios),
        "cpu_ratios": ratios,
        "calls_ratio": statistics.median(rate_ratios),
        "pairs": pairs,
    }
    keys = ("server_cpu_ms_per_call", "calls_per_s", "added_p50_ms", "added_p99_ms", "errors")
    summary.update(side_medians(pairs, keys))
    return summary


REWARD_SESSIONS = 512


def reward_server(seconds: int, baseline: str = BASELINE_COMMIT) -> dict[str, Any]:
    """The reward server with the rule judge at REWARD_SESSIONS sessions of new answers (where
    c98b67c starved its accepts): both trees, alone on core 0 in turn, wrk on core 1."""
    results: dict[str, Any] = {"baseline": baseline, "sessions": REWARD_SESSIONS}
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        servers: dict[str, tuple[int, str]] = {}
        for side in SIDES:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            tree = tree_of(side, baseline)
            command = reward_server_command(port)
            servers[side] = start_in_tree(stack, tree, side, command, base, work)
        pairs = [
            {
                side: run_wrk(
                    servers[side][0],
                    f"{servers[side][1]}/evaluate",
                    "reward-unique",
                    REWARD_SESSIONS,
                    seconds,
                )
                for side in SIDES
            }
            for _ in range(ROUNDS)
        ]
    results["pairs"] = pairs
    results["cpu_ratio"] = statistics.median(cpu_ratios(pairs))
    keys = ("server_cpu_ms_per_call", "calls_per_s", "p50_ms", "p99_ms", "max_ms")
    results.update(side_medians(pairs, keys))
    for side in SIDES:
        results[f"{side}_timeouts"] = sum(p[side]["timeouts"] for p in pairs)
        results[f"{side}_errors"] = sum(p[side]["errors"] for p in pairs)
        results[f"{side}_requests"] = sum(p[side]["requests"] for p in pairs)
    return results


def rollout(baseline: str = BASELINE_COMMIT) -> dict[str, Any]:
    from deepdive.local.model import train_tokenizer

    results: dict[str, Any] = {"baseline": baseline, "runs": []}
    trees = {side: tree_of(side, baseline) for side in SIDES}
    driver = Path(__file__).with_name("rollout_driver.py")
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        work = Path(tmp)
        texts = [
            "Which clockmaker built the silver orrery of Haldor? " * 20,
            '<tool_call>{"name": "search", "arguments": {"query": "orrery"}}</tool_call>' * 20,
            "【1】Orrery https://o.example/ A model. <tool_response>\n</tool_response>" * 20,
        ]
        train_tokenizer(texts, vocab_size=512).save_pretrained(work / "tokenizer")
        with rollout_fakes(work, ROLLOUT_TURNS) as url:
            for samples in ROLLOUT_SAMPLES:
                pairs = []
                for _ in range(ROLLOUT_ROUNDS):
                    pair = {}
                    for side, tree in trees.items():
                        completed = subprocess.run(
                            [
                                sys.executable,
                                str(driver),
                                str(tree),
                                url,
                                str(samples),
                                str(ROLLOUT_TURNS),
                                str(work / "tokenizer"),
                            ],
                            capture_output=True,
                            text=True,
                            check=True,
                            timeout=600,
                            env={**os.environ, "PYTHONPATH": str(tree)},
                        )
                        pair[side] = orjson.loads(completed.stdout.strip().splitlines()[-1])
                    pairs.append(pair)
                results["runs"].append(
                    {
                        "samples": samples,
                        "baseline_cpu_ms_per_turn": statistics.median(
                            p["baseline"]["cpu_ms_per_turn"] for p in pairs
                        ),
                        "this_cpu_ms_per_turn": statistics.median(
                            p["this"]["cpu_ms_per_turn"] for p in pairs
                        ),
                        "cpu_ratio": statistics.median(
                            ratio(p["baseline"]["cpu_ms_per_turn"], p["this"]["cpu_ms_per_turn"])
                            for p in pairs
                        ),
                        "identical_samples": all(
                            p["baseline"]["digest"] == p["this"]["digest"] for p in pairs
                        ),
                        "pairs": pairs,
                    }
                )
    return results
