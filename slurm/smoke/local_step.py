"""Step 6: one step of the local backend (world, warm start, one GRPO step of a tiny policy)
on the GPU, as `deepdive run` would take it there: it fits one GPU and needs no SGLang, so a
machine with a single accelerator can run it with step 1 (`--only 1,6`). It passes only when
the policy really ran on the GPU (torch allocated GPU memory), not when it fell back to the
CPU."""

from __future__ import annotations

import time

from deepdive.local.config import load_local_config
from deepdive.local.run import LocalRun
from slurm.smoke.context import SmokeContext
from slurm.smoke.gpus import no_gpu, torch_gpus
from slurm.smoke.report import Check, failed, passed

OVERRIDES = (
    "world.people=12", "world.cities=6", "world.guilds=4", "world.artifacts=8",
    "world.train_questions=8", "world.eval_questions=2", "world.sft_questions=8",
    "model.hidden=32", "model.layers=1", "model.heads=2", "model.vocab_size=600",
    "rollout.max_turns=3", "rollout.max_response_tokens=48", "warm_start.epochs=0.5",
    "warm_start.copy_steps=2", "grpo.steps=1", "grpo.prompts_per_step=2",
    "grpo.samples_per_prompt=2", "eval.questions=1", "eval.samples=1", "eval.before=false",
)  # fmt: skip


def run(context: SmokeContext) -> list[Check]:
    import torch

    name = "local backend step on the GPU"
    gpus, build = torch_gpus()
    if gpus == 0:
        return [failed(name, no_gpu("the local backend's GPU step"))]
    out = context.step_folder("6-local") / "run"
    config = load_local_config(None, [f'run.out="{out}"', *OVERRIDES])
    started = time.monotonic()
    summary = LocalRun(config).run()
    seconds = time.monotonic() - started
    used = torch.cuda.max_memory_allocated()
    if summary.get("grpo_steps") != 1:
        return [failed(name, f"expected 1 GRPO step, the run reports {summary.get('grpo_steps')}")]
    if used == 0:
        return [failed(name, f"the policy never allocated GPU memory: it ran on the CPU ({build})")]
    return [
        passed(
            name,
            f"warm start and 1 GRPO step in {seconds:.0f} s on {torch.cuda.get_device_name(0)}, "
            f"{used / 2**20:.0f} MiB of GPU memory at most",
        )
    ]
