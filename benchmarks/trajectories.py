"""What recording costs the rollout (issue 31: at most 2 % of its CPU per turn): the rollout
driver (benchmarks/rollout_driver.py, one process on core 0, instant fakes on core 1, 16 turns,
a Hugging Face fast tokenizer, groups of 8, the median of 5 batches), each batch ending in
slime's rollout log function, run in turn, pair by pair, for

    baseline   main before the recorder (BASELINE, or `--baseline REF`): no turn log, no
               agent statistics, nothing recorded
    sampled    this checkout, the default sample (trajectory_groups = 4 groups a step)
    all        this checkout, every episode recorded (what an evaluation records)

The recorder's writer thread is waited for inside the measured CPU. Two figures: the trees'
CPU per turn side by side (what the turn log in the hot path and everything after cost, within
the machine's noise), and, inside each process, the log function's CPU over the rest of the
batch's (the recorder's part alone, precise: both measured in the same batch). `python -m benchmarks
--only trajectories [--baseline REF]`; docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from benchmarks.baseline import ROOT, baseline_tree
from benchmarks.harness import rollout_fakes

BASELINE = "4dfeeeb"  # main when the recorder was built on it
SAMPLES = (64, 256)
TURNS = 16
ROUNDS = 5
VARIANTS = {"baseline": None, "sampled": "4", "all": "100000"}


def driver_run(
    tree: Path, url: str, samples: int, tokenizer: Path, folder: Path, groups: str | None
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree), "DEEPDIVE_TRAJECTORY_DIR": str(folder)}
    if groups is not None:
        env["DEEPDIVE_TRAJECTORY_GROUPS"] = groups
    driver = Path(__file__).with_name("rollout_driver.py")
    command = [sys.executable, str(driver), str(tree), url, str(samples), str(TURNS)]
    completed = subprocess.run(
        [*command, str(tokenizer), "5", "log"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        env=env,
    )
    result: dict[str, Any] = orjson.loads(completed.stdout.strip().splitlines()[-1])
    files = list(folder.rglob("step-*.jsonl.gz")) if folder.is_dir() else []
    result["recorded_bytes"] = sum(path.stat().st_size for path in files)
    return result


def run(baseline: str = BASELINE) -> dict[str, Any]:
    from deepdive.local.model import train_tokenizer

    trees = {"baseline": baseline_tree(baseline), "sampled": ROOT, "all": ROOT}
    results: dict[str, Any] = {"baseline": baseline, "runs": []}
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-") as tmp:
        work = Path(tmp)
        texts = [
            "Which clockmaker built the silver orrery of Haldor? " * 20,
            '<tool_call>{"name": "search", "arguments": {"query": "orrery"}}</tool_call>' * 20,
            "【1】Orrery https://o.example/ A model. <tool_response>\n</tool_response>" * 20,
        ]
        train_tokenizer(texts, vocab_size=512).save_pretrained(work / "tokenizer")
        with rollout_fakes(work, TURNS) as url:
            for samples in SAMPLES:
                pairs = []
                for round_ in range(ROUNDS):
                    pairs.append(
                        {
                            name: driver_run(
                                trees[name],
                                url,
                                samples,
                                work / "tokenizer",
                                work / f"traj-{samples}-{round_}-{name}",
                                groups,
                            )
                            for name, groups in VARIANTS.items()
                        }
                    )
                results["runs"].append(summary(samples, pairs))
    return results


def summary(samples: int, pairs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    def ratios(name: str) -> list[float]:
        return [p[name]["cpu_ms_per_turn"] / p["baseline"]["cpu_ms_per_turn"] for p in pairs]

    return {
        "samples": samples,
        **{
            f"{name}_cpu_ms_per_turn": statistics.median(p[name]["cpu_ms_per_turn"] for p in pairs)
            for name in VARIANTS
        },
        "sampled_ratios": [round(r, 4) for r in ratios("sampled")],
        "all_ratios": [round(r, 4) for r in ratios("all")],
        # in the same process: the log function's CPU (recorder and writer included) over the
        # rest of the rollout's, per batch; the precise figure on a noisy machine
        "sampled_log_share": statistics.median(p["sampled"]["log_share"] for p in pairs),
        "all_log_share": statistics.median(p["all"]["log_share"] for p in pairs),
        "baseline_log_share": statistics.median(p["baseline"]["log_share"] for p in pairs),
        "sampled_ratio": statistics.median(ratios("sampled")),
        "all_ratio": statistics.median(ratios("all")),
        "recorded_bytes": {name: pairs[0][name]["recorded_bytes"] for name in VARIANTS},
        "identical_samples": all(len({p[name]["digest"] for name in VARIANTS}) == 1 for p in pairs),
        "pairs": pairs,
    }
