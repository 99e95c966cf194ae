"""The embedded default, end to end, with 3 seeds: held-out reward after the warm start and
after GRPO, GRPO steps per minute, and where the time goes (rollout vs update), each seed a
full `deepdive run configs/local.toml` (world and run seed changed together), one after another
on this machine."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "local.toml"


def run_seed(seed: int, out: Path) -> dict[str, Any]:
    started = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm.cli",
            "run",
            str(CONFIG),
            "--set",
            f"run.seed={seed}",
            "--set",
            f"world.seed={seed}",
            "--set",
            f'run.out="{out}"',
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"seed {seed} failed:\n{result.stderr[-3000:]}")
    summary: dict[str, Any] = orjson.loads((out / "summary.json").read_bytes())
    split = summary["time_split_s"]
    before, after = summary["eval_reward_before"], summary["eval_reward_after"]
    episodes = summary["eval_episodes"]
    return {
        "seed": seed,
        "wall_s": round(time.monotonic() - started, 1),
        "warm_start_s": summary["warm_start"]["seconds"],
        "eval_before": before,
        "eval_after": after,
        "eval_episodes": episodes,
        # the standard error of after - before: two independent binomial estimates
        "lift_se": math.sqrt((before * (1 - before) + after * (1 - after)) / episodes),
        "train_reward_first": summary["train_reward_first"],
        "train_reward_last5": summary["train_reward_last5"],
        "steps": summary["grpo_steps"],
        "steps_per_minute": summary["steps_per_minute"],
        "rollout_s": split["rollout_s"],
        "update_s": split["update_s"],
        "sync_s": split["sync_s"],
    }


def run(seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-run-") as tmp:
        runs = [run_seed(seed, Path(tmp) / f"seed{seed}") for seed in seeds]
    before = [r["eval_before"] for r in runs]
    after = [r["eval_after"] for r in runs]
    return {
        "config": str(CONFIG.relative_to(ROOT)),
        "runs": runs,
        "eval_before_mean": statistics.mean(before),
        "eval_after_mean": statistics.mean(after),
        "lift_mean": statistics.mean(a - b for a, b in zip(after, before, strict=True)),
        # of the mean lift over the seeds, from each seed's binomial standard error
        "lift_mean_se": math.sqrt(sum(r["lift_se"] ** 2 for r in runs)) / len(runs),
        "lifted_seeds": sum(a > b for a, b in zip(after, before, strict=True)),
    }
