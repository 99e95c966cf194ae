"""Held-out evaluation: the mean reward of each set of questions, through the same hooks and
services GRPO uses, before and after training; over the episodes the engine answered, with the
aborted ones counted beside it (deepdive.eval_metrics: an aborted episode is no wrong answer)."""

from __future__ import annotations

from typing import Any

from deepdive.agent_stats import agent_statistics
from deepdive.eval_metrics import answered_accuracy
from deepdive.local.context import RunContext
from deepdive.local.episodes import Evaluation, sampling_params
from deepdive.local.rollouts import Rollouts
from deepdive.sample import status_name
from deepdive.trajectory_recorder import record_step


def evaluate(
    run: RunContext, rollouts: Rollouts, evaluations: list[Evaluation], when: str, step: int
) -> dict[str, float]:
    """The mean reward of each evaluation's questions x eval.samples, over the answered ones;
    every episode is recorded (RUN/trajectories/eval/, at the policy's `step`)."""
    temperature = run.config.eval.temperature
    values = {}
    played: dict[str, list[Any]] = {}
    for evaluation in evaluations:
        seed = f"{run.config.run.seed}:eval"
        if evaluation.name != "held-out":
            seed += f":{evaluation.name}"
        samples = rollouts.run(
            evaluation.services,
            evaluation.rows,
            run.config.eval.samples,
            sampling_params(run.config, temperature),
            seed,
        )
        value, aborted = answered_accuracy(
            [float(s.reward) for s in samples], [status_name(s) for s in samples]
        )
        values[evaluation.name] = value
        played[evaluation.name] = samples
        left_out = f", {aborted} of {len(samples)} ABORTED, not counted" if aborted else ""
        run.say(
            f"{evaluation.name} reward {when}: {value:.3f} ({len(evaluation.rows)} questions "
            f"x {run.config.eval.samples}, temperature {temperature}{left_out})"
        )
    every = [sample for samples in played.values() for sample in samples]
    record_step(
        run.paths.trajectories,
        step,
        played,
        groups=None,
        max_bytes=int(run.config.rollout.trajectory_max_mb * 2**20),
        evaluation=True,
        stats=agent_statistics(every),
    )
    return values
