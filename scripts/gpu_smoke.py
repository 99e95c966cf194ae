"""`make gpu-smoke MODEL=/models/Qwen2.5-0.5B-Instruct`: a short check of the training image on a
GPU node (under 5 minutes), printing what it checked:

1. the GPU: torch sees it, and the versions of torch, SGLang, slime and Megatron-LM;
2. the services: the tool server (offline, on a tiny generated world) and the reward server
   (rule judge), started and answering /ready;
3. SGLang serving MODEL, and one multi-turn episode of `deepdive.rollout.generate_with_tool`
   against it and the services, rewarded by `reward_func` (the token arrays checked);
4. one step of the local backend (warm start and one GRPO step of a tiny policy) on the GPU.

`--no-sglang` skips step 3 and runs the rest wherever it is (the tests run it on CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHECKS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    CHECKS.append((name, ok, detail))
    print(f"[{'ok' if ok else 'FAILED'}] {name}{': ' + detail if detail else ''}", flush=True)


def versions() -> None:
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    found = [f"torch {torch.__version__} (CUDA {torch.version.cuda}, {gpus} GPU(s))"]
    for name in ("sglang", "slime", "megatron"):
        try:
            module = importlib.import_module(name)
            found.append(f"{name} {getattr(module, '__version__', module.__file__)}")
        except ImportError:
            found.append(f"{name} missing")
    check("libraries", True, "; ".join(found))


def world(folder: Path) -> tuple[Path, list[dict[str, Any]]]:
    from deepdive.convert import convert
    from deepdive.local.prompts import read_prompt_rows
    from deepdive.offline.build import write_world
    from deepdive.offline.world import WorldSizes

    sizes = WorldSizes(
        people=12,
        cities=6,
        guilds=4,
        artifacts=8,
        train_questions=8,
        eval_questions=2,
        sft_questions=8,
        max_hops=1,
    )
    write_world(folder / "world", 1, sizes)
    convert(folder / "world" / "qa_eval.jsonl", folder / "eval.jsonl", source="world")
    return folder / "world" / "corpus.jsonl", read_prompt_rows(folder / "eval.jsonl")


def episode(model: str, urls: dict[str, str], row: dict[str, Any], logs: Path) -> None:
    from deepdive.clients import close_clients
    from deepdive.local.prompts import sample_from_row
    from deepdive.rollout import generate_with_tool, reward_func
    from deepdive.rollout_settings import RolloutSettings, rollout_args
    from slurm.sglang_server import sglang_server

    started = time.monotonic()
    with sglang_server(Path(model), logs / "sglang.log") as url:
        check("SGLang", True, f"{model} ready at {url} in {time.monotonic() - started:.0f} s")
        settings = RolloutSettings(
            url, urls["tools"], urls["reward"], max_turns=4, max_context_tokens=8192
        )
        args = rollout_args(settings)
        args.hf_checkpoint = model

        async def play() -> Any:
            sample = await generate_with_tool(
                args, sample_from_row(row), {"max_new_tokens": 1024, "temperature": 0.7}
            )
            sample.reward = await reward_func(args, sample)
            await close_clients()
            return sample

        sample = asyncio.run(play())
    aligned = len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
    check(
        "episode",
        aligned and sample.response_length > 0,
        f"{sample.status}, {sample.metadata['deepdive']['turns']} turns, "
        f"{sample.response_length} response tokens, reward {sample.reward}",
    )


def local_step(folder: Path) -> None:
    import torch

    from deepdive.local.config import load_local_config
    from deepdive.local.run import LocalRun

    overrides = [
        f'run.out="{folder / "local"}"', "world.people=12", "world.cities=6", "world.guilds=4",
        "world.artifacts=8", "world.train_questions=8", "world.eval_questions=2",
        "world.sft_questions=8", "model.hidden=32", "model.layers=1", "model.heads=2",
        "model.vocab_size=600", "rollout.max_turns=3", "rollout.max_response_tokens=48",
        "warm_start.epochs=0.5", "warm_start.copy_steps=2", "grpo.steps=1",
        "grpo.prompts_per_step=2", "grpo.samples_per_prompt=2", "eval.questions=1",
        "eval.samples=1", "eval.before=false",
    ]  # fmt: skip
    started = time.monotonic()
    summary = LocalRun(load_local_config(None, overrides)).run()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    check(
        "local backend step",
        summary["grpo_steps"] == 1,
        f"on {device}, {time.monotonic() - started:.0f} s",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="", help="a small Hugging Face model folder")
    parser.add_argument("--no-sglang", action="store_true", help="skip SGLang and the episode")
    args = parser.parse_args()
    if not args.no_sglang and not args.model:
        parser.error("MODEL is required (or --no-sglang)")
    from deepdive.local.stack import tool_server
    from services.process import ServiceProcess

    started = time.monotonic()
    versions()
    with tempfile.TemporaryDirectory(prefix="deepdive-gpu-smoke-") as tmp:
        folder = Path(tmp)
        corpus, rows = world(folder)
        tools = tool_server(corpus.parent, folder / "tools.log")
        reward = ServiceProcess("reward", ["reward", "--judge", "rule"], folder / "reward.log")
        with tools, reward:
            check("services", True, f"tools {tools.url}, reward {reward.url}")
            if not args.no_sglang:
                episode(args.model, {"tools": tools.url, "reward": reward.url}, rows[0], folder)
        local_step(folder)
    failed = [name for name, ok, _ in CHECKS if not ok]
    print(
        f"gpu-smoke: {len(CHECKS) - len(failed)}/{len(CHECKS)} checks passed in {time.monotonic() - started:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
