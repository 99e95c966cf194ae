"""Held-out evaluation: the mean reward of each set of questions, through the same hooks and
services GRPO uses, before and after training."""

from __future__ import annotations

from deepdive.local.context import RunContext
from deepdive.local.episodes import Evaluation, sampling_params
from deepdive.local.rollouts import Rollouts


def evaluate(
    run: RunContext, rollouts: Rollouts, evaluations: list[Evaluation], when: str
) -> dict[str, float]:
    """The mean reward of each evaluation's questions x eval.samples."""
    temperature = run.config.eval.temperature
    values = {}
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
        value = sum(float(s.reward) for s in samples) / max(1, len(samples))
        values[evaluation.name] = value
        run.say(
            f"{evaluation.name} reward {when}: {value:.3f} ({len(evaluation.rows)} questions "
            f"x {run.config.eval.samples}, temperature {temperature})"
        )
    return values
