"""Reward server throughput and latency: the rule judge, cached judge verdicts, and an LLM judge
(faked, fixed latency) with and without a binding concurrency bound.

Layout on a 2-core machine: the reward server alone on core 0; the fake judge and wrk on core 1.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness import (
    add_latency_over,
    free_port,
    pinned,
    process,
    python_module,
    run_wrk,
)

JUDGE_LATENCY_S = 0.1
BOUND = 16


def reward_server(port: int, *extra: str) -> list[str]:
    return pinned(
        python_module(
            "slurm.cli", "serve", "reward", "--port", str(port), "--log-level", "INFO", *extra
        ),
        core=0,
    )


def judged_load(
    pid: int, base: str, judge: str, kind: str, sessions: int, seconds: int
) -> dict[str, Any]:
    httpx.post(f"{judge}/reset")
    result = run_wrk(pid, f"{base}/evaluate", kind, sessions, seconds)
    time.sleep(1)
    stats = httpx.get(f"{judge}/stats").json()
    result["judge_calls"] = stats["calls"]
    result["judge_peak_concurrency"] = stats["peak_concurrency"]
    return result


def run(seconds: int = 8) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "DEEPDIVE_JUDGE_API_KEY": "bench-key-not-secret"}
        env.pop("DEEPDIVE_SERVICE_TOKEN", None)
        judge_port = free_port()
        judge = f"http://127.0.0.1:{judge_port}"
        fake = pinned(
            python_module(
                "fakes.upstream",
                "--port",
                str(judge_port),
                "--latency",
                str(JUDGE_LATENCY_S),
            ),
            core=1,
        )
        results: dict[str, Any] = {
            "judge_latency_ms": JUDGE_LATENCY_S * 1000,
            "bound": BOUND,
            "runs": [],
        }
        with process(fake, f"{judge}/stats", work / "fake.log"):
            port = free_port()
            with process(
                reward_server(port), f"http://127.0.0.1:{port}/health", work / "rule.log", env
            ) as server:
                run_ = run_wrk(
                    server.pid, f"http://127.0.0.1:{port}/evaluate", "reward-unique", 64, seconds
                )
                results["runs"].append({**run_, "judge": "rule"})
            for bound in (BOUND, 1024):
                port = free_port()
                command = reward_server(
                    port,
                    "--judge",
                    "openai",
                    "--judge-upstream.base-url",
                    f"{judge}/v1",
                    "--judge-upstream.max-concurrency",
                    str(bound),
                )
                with process(
                    command, f"http://127.0.0.1:{port}/health", work / f"openai-{bound}.log", env
                ) as server:
                    base = f"http://127.0.0.1:{port}"
                    if bound == BOUND:
                        run_ = judged_load(server.pid, base, judge, "reward-same", 64, seconds)
                        results["runs"].append({**run_, "judge": "openai (cached verdict)"})
                    for sessions in (64, 512):
                        run_ = judged_load(
                            server.pid, base, judge, "reward-unique", sessions, seconds
                        )
                        results["runs"].append({**run_, "judge": f"openai, bound {bound}"})
        for entry in results["runs"]:
            if entry["judge"].startswith("openai,"):
                add_latency_over(entry, JUDGE_LATENCY_S)
        return results
