"""The GRPO loop: warm start (or resume), steps of rollouts -> group advantages -> clipped
updates -> weights synced into the engine, checkpoints, and the evaluations around it."""

from __future__ import annotations

import time
from typing import Any

from deepdive.aborts import check_aborted_share
from deepdive.agent_stats import LOCAL_PREFIX, agent_statistics
from deepdive.local.checkpoint import restore_rng, rng_state, save_checkpoint
from deepdive.local.context import RunContext
from deepdive.local.episodes import (
    WORLD,
    Evaluation,
    examples_from,
    rollout_metrics,
    sampling_params,
)
from deepdive.local.evaluation import evaluate
from deepdive.local.grpo import group_advantages, scoring_temperature
from deepdive.local.prompts import PromptSampler
from deepdive.local.rollouts import Rollouts
from deepdive.local.run_log import RunLog, plot_rewards
from deepdive.local.trainer import OptimizerSettings, PolicyTrainer, learned_from
from deepdive.local.warm_start_stage import run_warm_start
from deepdive.sample import status_name
from deepdive.save_timing import SaveTimer, WarningFlag
from deepdive.tool_errors import check_tool_error_share, tool_error_metrics
from deepdive.trajectory_recorder import flush_recorders, record_step
from services.base.files import atomic_path

# a step with more episodes ABORTED than rollout.max_aborted_share stops the run
LOCAL_HINTS = (
    "The engine failed them (its log is the run's: an error on a batch, a worker that "
    "stopped). The limit is rollout.max_aborted_share."
)
# ... and more tool calls failed than rollout.max_tool_error_share
LOCAL_TOOL_HINTS = (
    "Check the tool server's log in the run's logs/ (its search and page upstreams' errors). "
    "The limit is rollout.max_tool_error_share."
)


def train(
    run: RunContext,
    model: Any,
    tokenizer: Any,
    rollouts: Rollouts,
    train_rows: list[dict[str, Any]],
    evaluations: list[Evaluation],
    resumed: tuple[int, dict[str, Any]] | None,
) -> dict[str, Any]:
    """Warm start (or resume), GRPO steps, and the evaluations before and after.
    The first evaluation is this world's held-out questions, on the services GRPO uses."""
    config, paths = run.config, run.paths
    grpo = config.grpo
    # Slurm's warning (preemption or time limit): save at the next step's end, not only every
    # checkpoint.every steps, and say how long saves take (deepdive/save_timing.py)
    warning = WarningFlag().install()
    timer = SaveTimer.from_environment()
    sampler = PromptSampler(len(train_rows), config.run.seed)
    summary: dict[str, Any] = {}
    if resumed is None:
        summary["warm_start"] = run_warm_start(run, model, tokenizer)
        rollouts.load_state_dict(model.state_dict())
        start_step = 0
    settings = OptimizerSettings(grpo.lr, grpo.weight_decay, grpo.max_grad_norm, grpo.micro_batch)
    reference = PolicyTrainer.frozen_copy(model) if grpo.kl_coef > 0 else None
    trainer = PolicyTrainer(model, tokenizer.pad_token_id, settings, reference)
    before: dict[str, float] | None = None
    if resumed is None:
        # Saved before its evaluation: a requeue during a long evaluation (or a slow node's)
        # resumes after the warm start instead of doing it again, every attempt alike.
        save(run, 0, trainer, sampler, None, summary.get("warm_start"), timer)
    else:
        start_step, state = resumed
        trainer.load_state_dict(state["trainer"])
        sampler.restore(state["sampler"])
        restore_rng(state["rng"])
        before = state["eval_before"]
        summary["warm_start"] = state.get("warm_start")
        rollouts.load_state_dict(model.state_dict())
        run.say(f"resumed from {paths.checkpoints} at step {start_step}")
    if before is None:  # a fresh run, or one resumed from the warm start's checkpoint
        before = {}
        if config.eval.before:
            before = evaluate(run, rollouts, evaluations, "after the warm start", start_step)
        save(run, start_step, trainer, sampler, before, summary.get("warm_start"), timer)
    log = RunLog(paths.logs, resume_after_step=start_step if resumed else None)
    totals = {"rollout_s": 0.0, "update_s": 0.0, "sync_s": 0.0}
    with run.progress() as progress:
        task = progress.add_task("GRPO", total=grpo.steps, completed=start_step, info="")
        for step in range(start_step + 1, grpo.steps + 1):
            metrics = grpo_step(run, step, trainer, rollouts, train_rows, sampler)
            for key in totals:
                totals[key] += metrics[key]
            log.write(step, metrics)
            progress.update(task, advance=1, info=f"reward {metrics['reward_mean']:.2f}")
            if not run.console.is_terminal:
                run.say(
                    f"step {step}/{grpo.steps}: reward {metrics['reward_mean']:.3f} "
                    f"pass@{grpo.samples_per_prompt} {metrics['pass_at_n']:.2f} "
                    f"turns {metrics['turns_mean']:.1f} rollout {metrics['rollout_s']:.1f}s "
                    f"update {metrics['update_s']:.1f}s"
                )
            if warning.warned:
                run.say(f"step {step}: saving now, the job was warned (preemption or time limit)")
            if step % config.checkpoint.every == 0 or step == grpo.steps or warning.warned:
                save(run, step, trainer, sampler, before, summary.get("warm_start"), timer)
    after = evaluate(run, rollouts, evaluations, "after GRPO", grpo.steps)
    flush_recorders()  # every step's episodes on disk before the run's report
    rows = log.rows()
    log.close()
    with atomic_path(paths.final_model) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    if rows:
        lines: dict[str, float | None] = {}
        for name in after:
            lines[f"{name} after warm start"] = before.get(name)
            lines[f"{name} after GRPO"] = after[name]
        plot_rewards(rows, paths.plot, lines)
    steps_done = grpo.steps - start_step
    grpo_s = sum(totals.values())
    summary.update(
        {
            "eval_reward_before": before.get("held-out"),
            "eval_reward_after": after["held-out"],
            "eval_questions": len(evaluations[0].rows),
            "eval_episodes": len(evaluations[0].rows) * config.eval.samples,
            "grpo_steps": grpo.steps,
            "grpo_steps_this_session": steps_done,
            "steps_per_minute": round(60 * steps_done / grpo_s, 2) if grpo_s else None,
            "time_split_s": {k: round(v, 1) for k, v in totals.items()},
            "train_reward_first": rows[0]["reward_mean"] if rows else None,
            "train_reward_last5": (
                sum(r["reward_mean"] for r in rows[-5:]) / len(rows[-5:]) if rows else None
            ),
        }
    )
    if "unseen" in after:
        summary.update(
            {
                "unseen_reward_before": before.get("unseen"),
                "unseen_reward_after": after["unseen"],
                "unseen_questions": len(evaluations[1].rows),
            }
        )
    return summary


def grpo_step(
    run: RunContext,
    step: int,
    trainer: PolicyTrainer,
    rollouts: Rollouts,
    train_rows: list[dict[str, Any]],
    sampler: PromptSampler,
) -> dict[str, Any]:
    """One step: a batch of groups, their advantages, updates_per_step updates, a weight sync
    (to the engine of every node that plays episodes)."""
    config = run.config
    grpo = config.grpo
    started = time.monotonic()
    rows = [train_rows[i] for i in sampler.take(grpo.prompts_per_step)]
    samples = rollouts.run(
        WORLD,
        rows,
        grpo.samples_per_prompt,
        sampling_params(config, config.rollout.temperature),
        f"{config.run.seed}:{step}",
    )
    agent = agent_statistics(samples)
    # recorded before the checks, as the slime hook does: a step that stops the run keeps them
    record_step(
        run.paths.trajectories,
        step,
        samples,
        groups=config.rollout.trajectory_groups,
        max_bytes=int(config.rollout.trajectory_max_mb * 2**20),
        stats=agent,
    )
    check_aborted_share(samples, config.rollout.max_aborted_share, step, hints=LOCAL_HINTS)
    tools = check_tool_error_share(
        samples, config.rollout.max_tool_error_share, step, hints=LOCAL_TOOL_HINTS
    )
    per_node = {f"samples_node_{node}": count for node, count in rollouts.node_counts().items()}
    rollout_s = time.monotonic() - started
    rewards = [float(s.reward) for s in samples]
    answered = [status_name(s) != "ABORTED" for s in samples]
    advantages = group_advantages(rewards, grpo.samples_per_prompt, grpo.normalize_std, answered)
    examples = examples_from(samples, advantages)
    started = time.monotonic()
    update: dict[str, float] = {}
    chunk = max(1, len(examples) // grpo.updates_per_step)
    if grpo.updates_per_step > 1:  # the later updates' old policy is this one, not theirs
        trainer.score(
            learned_from(examples, grpo.kl_coef), scoring_temperature(config.rollout.temperature)
        )
    for start in range(0, len(examples), chunk):
        parts = trainer.grpo_step(
            examples[start : start + chunk],
            grpo.clip_low,
            grpo.clip_high,
            grpo.kl_coef,
            grpo.per_token_loss,
            scoring_temperature(config.rollout.temperature),
        )
        for key, value in parts.items():
            update[key] = update.get(key, 0.0) + value / grpo.updates_per_step
    update_s = time.monotonic() - started
    started = time.monotonic()
    rollouts.load_state_dict(trainer.model.state_dict())
    sync_s = time.monotonic() - started
    return {
        **rollout_metrics(samples, grpo.samples_per_prompt),
        **per_node,
        **tool_error_metrics(tools, prefix=""),
        **{LOCAL_PREFIX + key: value for key, value in agent.items()},
        **dict(update),
        "rollout_s": rollout_s,
        "update_s": update_s,
        "sync_s": sync_s,
    }


def save(
    run: RunContext,
    step: int,
    trainer: PolicyTrainer,
    sampler: PromptSampler,
    eval_before: dict[str, float] | None,
    warm_start_summary: dict[str, Any] | None,
    timer: SaveTimer,
) -> None:
    """`eval_before` None: the evaluation after the warm start is still to come. The save's
    time goes to the timer's record (what node 0 weighs against the warning's time)."""
    started = time.monotonic()
    state = {
        "trainer": trainer.state_dict(),
        "sampler": sampler.state(),
        "rng": rng_state(),
        "eval_before": eval_before,  # evaluation name -> reward after the warm start
        "warm_start": warm_start_summary,
        "config": run.config_dict,
    }
    save_checkpoint(run.paths.checkpoints, step, state, run.config.checkpoint.keep)
    timer.saved(step, time.monotonic() - started)
