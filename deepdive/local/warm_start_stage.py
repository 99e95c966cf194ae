"""The warm start as a stage of the run: the copy warm-up, then the demonstrations of the qa_sft
questions (which GRPO never samples), with progress and a summary of both."""

from __future__ import annotations

import time
from typing import Any

from deepdive.local.context import RunContext
from deepdive.local.trainer import OptimizerSettings, PolicyTrainer
from deepdive.local.warm_start import (
    DemonstrationExamples,
    copy_warm_up,
    read_demonstrations,
    warm_start,
)
from deepdive.protocol import SYSTEM_PROMPTS


def run_warm_start(run: RunContext, model: Any, tokenizer: Any) -> dict[str, Any]:
    """On the demonstrations of the qa_sft questions, which GRPO never samples."""
    section, seed = run.config.warm_start, run.config.run.seed
    examples = DemonstrationExamples(
        read_demonstrations(run.paths.world / "demonstrations.jsonl"),
        tokenizer,
        SYSTEM_PROMPTS[run.config.rollout.system_prompt],
        section.observation_weight,
        section.rename,
        seed,
    )

    def new_trainer(lr: float) -> PolicyTrainer:
        settings = OptimizerSettings(lr, 0.0, 1.0, run.config.grpo.micro_batch)
        return PolicyTrainer(model, tokenizer.pad_token_id, settings)

    started = time.monotonic()
    copy_history: list[dict[str, float]] = []
    with run.progress() as progress:
        task = progress.add_task("copy warm-up", total=None, info="")

        def on_step(step: int, total: int, metrics: dict[str, float]) -> None:
            progress.update(task, completed=step, total=total, info=f"loss {metrics['loss']:.3f}")
            if not run.console.is_terminal and (step % 10 == 0 or step == total):
                name = progress.tasks[task].description
                run.say(f"{name} {step}/{total}: loss {metrics['loss']:.3f}")

        if section.copy_steps:
            special = set(tokenizer.all_special_ids)
            copy_history = copy_warm_up(
                new_trainer(section.copy_lr),
                [i for i in range(len(tokenizer)) if i not in special],
                section.copy_steps,
                section.copy_length,
                section.copy_batch,
                section.copy_lr,
                seed,
                on_step,
            )
        progress.update(task, description="warm start", completed=0, total=None)
        history = warm_start(
            new_trainer(section.lr),
            examples,
            section.epochs,
            section.batch_size,
            section.lr,
            section.warmup_steps,
            seed,
            on_step,
        )
    return {
        "copy_steps": len(copy_history),
        "copy_final_loss": copy_history[-1]["loss"] if copy_history else None,
        "demonstrations": len(examples),
        "steps": len(history),
        "final_loss": history[-1]["loss"] if history else None,
        "seconds": round(time.monotonic() - started, 1),
    }
