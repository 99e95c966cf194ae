"""One rollout measurement in a fresh interpreter, for one source tree: the side-by-side
benchmark runs it once for main at the baseline commit and once for this checkout.

    python benchmarks/rollout_driver.py TREE URL SAMPLES TURNS TOKENIZER [BATCHES [log]]

TREE goes first on sys.path, so `deepdive` is that tree's; only the interface both trees share
is used (the `deepdive_*` args and `generate_with_tool`). TOKENIZER is a saved Hugging Face
tokenizer folder, or `byte` (one token per UTF-8 byte). After a warm-up batch of 8, BATCHES
batches of SAMPLES concurrent episodes run one after another in the same process and event
loop, as a trainer's rollouts do (one batch of 64 lasts ~0.4 s: alone it measures connection
set-up and cold caches more than turns). Prints one JSON line: the rollout's CPU per turn (this
process alone, pinned to one core), the median over the batches, and a digest of every sample's
tokens, loss mask, log-probs, response text and status, equal for every batch, so the two
trees' samples can be compared. The samples come in groups of 8. With `log`, each batch ends as
a trainer's rollout does, in slime's rollout log function (`deepdive.aborts.log_rollout`:
the agent statistics, and, where the tree has one, the trajectory recorder, whose folder and
sample are DEEPDIVE_TRAJECTORY_DIR and DEEPDIVE_TRAJECTORY_GROUPS), its writer waited for,
inside the measured CPU (the writer's thread counts: process time is every thread's).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import os
import statistics
import sys
import time
import uuid
from argparse import Namespace
from pathlib import Path
from typing import Any

PROMPT = (
    "<|im_start|>user\nWhich clockmaker built the silver orrery of Haldor?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


class ByteTokenizer:
    """One token per UTF-8 byte."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))


def load_tokenizer(spec: str) -> Any:
    if spec == "byte":
        return ByteTokenizer()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec)


def digest(samples: list[Any]) -> str:
    hasher = hashlib.sha256()
    for sample in samples:
        record = [
            sample.tokens,
            sample.loss_mask,
            sample.rollout_log_probs,
            sample.response,
            getattr(sample.status, "name", str(sample.status)),
        ]
        hasher.update(json.dumps(record).encode())
    return hasher.hexdigest()[:16]


GROUP = 8


def log_rollout(step: int, args: Any, samples: list[Any]) -> None:
    """slime's rollout log path for the batch, and the recorder's writer waited for."""
    from deepdive.aborts import log_rollout as logged

    logged(step, args, samples, {}, 0.0)
    try:
        from deepdive.trajectory_recorder import flush_recorders
    except ImportError:  # a tree without the recorder
        return
    flush_recorders()


async def episodes(
    url: str, samples: int, turns: int, tokenizer: Any, log: bool = False, step: int = 0
) -> dict[str, Any]:
    # By the tree's own files: a tree from before the hooks' split (2a5d2bd and older) has no
    # deepdive/generate.py, and importing it there would find the editable install's (this
    # checkout's), leaving its modules in sys.modules for the old tree to use. By name, not
    # `from ... import`: mypy would judge a module this tree lacks, and its verdict differs
    # between a checkout and an installed wheel.
    package = importlib.import_module("deepdive")
    split = (Path(package.__file__ or "").parent / "generate.py").is_file()
    hooks = importlib.import_module("deepdive.generate" if split else "deepdive.rollout")
    generate_with_tool = hooks.generate_with_tool
    from deepdive.sample import LocalSample

    args = Namespace(
        deepdive_sglang_url=url,
        deepdive_tool_server_url=[[url]],
        deepdive_reward_server_url=[url],
        deepdive_tokenizer=tokenizer,
        deepdive_max_turns=turns + 1,
        rollout_max_context_len=1_000_000,
    )
    run = uuid.uuid4().hex[:8]  # the fake counts turns per session: new names every run
    batch = [
        LocalSample(
            prompt=PROMPT, label="Ilse Varen", session_id=f"{run}-{k}", group_index=k // GROUP
        )
        for k in range(samples)
    ]
    started, cpu = time.perf_counter(), time.process_time()
    done = await asyncio.gather(
        *(generate_with_tool(args, s, {"max_new_tokens": 100_000}) for s in batch)
    )
    log_cpu = time.process_time()
    if log:
        log_rollout(step, args, list(done))
    log_cpu = time.process_time() - log_cpu
    elapsed, cpu_used = time.perf_counter() - started, time.process_time() - cpu
    turns_done = sum(s.metadata["deepdive"]["turns"] for s in done)
    return {
        "samples": samples,
        "turns": turns_done,
        "completed": sum(getattr(s.status, "name", "") == "COMPLETED" for s in done),
        "seconds": round(elapsed, 3),
        "cpu_ms_per_turn": round(cpu_used * 1000 / max(1, turns_done), 4),
        # of which the log function's (and the recorder's writer's, waited for)
        "log_cpu_ms_per_turn": round(log_cpu * 1000 / max(1, turns_done), 5),
        "turns_per_s": round(turns_done / elapsed, 1),
        "digest": digest(list(done)),
    }


async def batches(
    url: str, samples: int, turns: int, count: int, tokenizer: Any, log: bool = False
) -> dict[str, Any]:
    from deepdive.clients import close_clients

    await episodes(url, 8, turns, tokenizer, log)  # warm-up: imports, pools, caches
    runs = [
        await episodes(url, samples, turns, tokenizer, log, step) for step in range(1, count + 1)
    ]
    await close_clients()
    digests = {run["digest"] for run in runs}
    per_turn = sorted(run["cpu_ms_per_turn"] for run in runs)
    return {
        **runs[0],
        "batches": count,
        "cpu_ms_per_turn": per_turn[len(per_turn) // 2],
        "log_share": statistics.median(
            run["log_cpu_ms_per_turn"] / (run["cpu_ms_per_turn"] - run["log_cpu_ms_per_turn"])
            for run in runs
        ),
        "cpu_ms_per_turn_each": [run["cpu_ms_per_turn"] for run in runs],
        "digest": digests.pop() if len(digests) == 1 else "batches differ",
    }


def main() -> None:
    tree, url, samples, turns, tokenizer_spec = sys.argv[1:6]
    count = int(sys.argv[6]) if len(sys.argv) > 6 else 5
    log = len(sys.argv) > 7 and sys.argv[7] == "log"
    sys.path.insert(0, tree)
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    import uvloop

    tokenizer = load_tokenizer(tokenizer_spec)
    result = uvloop.run(batches(url, int(samples), int(turns), count, tokenizer, log))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
