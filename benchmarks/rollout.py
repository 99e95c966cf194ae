"""Rollout overhead: 256 concurrent samples of 16 turns against instant fake SGLang and tool
servers. The rollout runs in this process, pinned to core 0; the fakes run on core 1.

turns/s is what one core of rollout code sustains here; CPU per turn is the overhead each turn
adds (HTTP to SGLang and the tool server, parsing, tokenising the observation, bookkeeping).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import rollout_fakes
from deepdive.clients import close_clients
from deepdive.generate import generate_with_tool
from deepdive.rollout_settings import RolloutSettings, rollout_args
from deepdive.sample import LocalSample
from fakes.sglang import ByteTokenizer

TURNS = 16
SAMPLES = 256
PROMPT = "<|im_start|>user\nWhich clockmaker built the silver orrery of Haldor?<|im_end|>\n<|im_start|>assistant\n"


async def run_rollouts(base: str, samples: int) -> tuple[float, float, list[LocalSample]]:
    settings = RolloutSettings(
        sglang_url=base,
        tool_server_url=((base,),),
        reward_server_url=(base,),
        max_turns=TURNS + 1,
        max_context_tokens=1_000_000,
    )
    args = rollout_args(settings, ByteTokenizer())
    batch = [LocalSample(prompt=PROMPT, label="Ilse Varen") for _ in range(samples)]
    started, cpu = time.perf_counter(), time.process_time()
    done = await asyncio.gather(
        *(generate_with_tool(args, s, {"max_new_tokens": 100_000}) for s in batch)
    )
    elapsed, cpu_used = time.perf_counter() - started, time.process_time() - cpu
    await close_clients()
    return elapsed, cpu_used, list(done)


def run(samples: int = SAMPLES) -> dict[str, Any]:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    with (
        tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp,
        rollout_fakes(Path(tmp), TURNS) as url,
    ):
        runner(run_rollouts(url, 8))  # warm-up
        elapsed, cpu, done = runner(run_rollouts(url, samples))
    turns = sum(s.metadata["deepdive"]["turns"] for s in done)
    completed = sum(s.status.name == "COMPLETED" for s in done)
    return {
        "samples": samples,
        "turns_per_sample": TURNS,
        "completed": completed,
        "turns": turns,
        "seconds": round(elapsed, 2),
        "turns_per_s": round(turns / elapsed, 1),
        "rollout_cpu_ms_per_turn": round(cpu * 1000 / turns, 3),
        "turns_per_cpu_s": round(turns / cpu, 1),
    }
