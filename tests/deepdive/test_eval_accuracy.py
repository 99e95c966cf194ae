"""Evaluation accuracy over the episodes SGLang answered, the aborted count beside it
(deepdive.eval_metrics): in slime's eval logging (our --custom-eval-rollout-log-function-path
over slime's `log_eval_rollout_data`, transcribed in tests/helpers.py), in the local run's
evaluations, and in `deepdive eval`'s summary (tests/slurm/test_eval_aborted.py)."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deepdive.eval_metrics import pass_at_k
from deepdive.local.config import load_local_config
from deepdive.local.context import RunContext
from deepdive.local.episodes import WORLD, Evaluation
from deepdive.local.evaluation import evaluate
from deepdive.local.rollouts import InProcessRollouts, settings_for
from deepdive.protocol import format_tool_call
from deepdive.rollout_settings import EVAL_LOG_FUNCTION_PATH, rollout_args
from deepdive.run_paths import RunPaths
from deepdive.sample import LocalSample, SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn
from tests.helpers import (
    FORBIDDEN_QUESTION,
    make_args,
    serve_in_thread,
    slime_log_eval_rollout_data,
    slime_pass_rate,
)

FINISH = format_tool_call("finish", {"answer": "Ilse Varen"})


def eval_set(correct: int, wrong: int, aborted: int) -> dict[str, Any]:
    """One evaluation set as slime's eval rollout returns it (slime/rollout/sglang_rollout.py,
    lines 629-635): rewards, truncated flags and samples, aligned; aborted episodes scored 0
    (the hook's reward for them)."""
    statuses = [SampleStatus.COMPLETED] * (correct + wrong) + [SampleStatus.ABORTED] * aborted
    rewards = [1.0] * correct + [0.0] * (wrong + aborted)
    order = list(range(len(rewards)))
    random.Random(3).shuffle(order)  # aborted episodes anywhere in the set
    samples = [LocalSample(index=i, reward=rewards[i], status=statuses[i]) for i in order]
    return {
        "rewards": [s.reward for s in samples],
        "truncated": [False] * len(samples),
        "samples": samples,
    }


def eval_args(**extra: Any) -> Any:
    args = make_args("http://127.0.0.1:9", {"tools": "http://t", "reward": "http://r"}, **extra)
    args.custom_eval_rollout_log_function_path = EVAL_LOG_FUNCTION_PATH
    args.n_samples_per_eval_prompt = 1
    return args


def test_an_evaluations_accuracy_is_over_the_answered_episodes() -> None:
    """The issue's set: 4 right of 9 answered, 2 aborted. slime logged 4/11."""
    [logged] = slime_log_eval_rollout_data(3, eval_args(), {"bc": eval_set(4, 5, 2)})
    assert logged["eval/bc"] == pytest.approx(4 / 9)
    assert logged["eval/bc/aborted"] == 2 and logged["eval/bc/episodes"] == 11
    assert logged["eval/bc-truncated_ratio"] == 0.0


def test_without_aborts_slime_logs_the_evaluation_as_always() -> None:
    [logged] = slime_log_eval_rollout_data(3, eval_args(), {"bc": eval_set(4, 7, 0)})
    assert logged == {"eval/bc": 4 / 11, "eval/bc-truncated_ratio": 0.0}


def test_every_set_is_logged_once_each_over_its_own_answered() -> None:
    data = {"bc": eval_set(4, 5, 2), "web": eval_set(1, 1, 0)}
    [logged] = slime_log_eval_rollout_data(3, eval_args(), data)
    assert logged["eval/bc"] == pytest.approx(4 / 9) and logged["eval/web"] == 0.5
    assert logged["eval/web/aborted"] == 0


def test_a_set_with_no_answer_reads_zero_not_a_crash() -> None:
    [logged] = slime_log_eval_rollout_data(
        3, eval_args(max_aborted_share=1.0), {"bc": eval_set(0, 0, 3)}
    )
    assert logged["eval/bc"] == 0.0 and logged["eval/bc/aborted"] == 3


def test_pass_at_k_stays_over_whole_groups_an_abort_unsolved() -> None:
    """Pass@k needs whole groups: slime's estimator over every episode, as before."""
    args = eval_args()
    args.log_passrate, args.n_samples_per_eval_prompt = True, 4
    data = {"bc": eval_set(5, 5, 2)}
    [logged] = slime_log_eval_rollout_data(3, args, data)
    expected = slime_pass_rate(data["bc"]["rewards"], 4)
    assert {k: logged[f"eval/bc-{k}"] for k in expected} == pytest.approx(expected)
    assert logged["eval/bc"] == 0.5  # 5 of the 10 answered


def test_pass_at_k_is_slimes_estimator() -> None:
    rng = random.Random(11)
    for _ in range(40):
        size = rng.choice([2, 3, 4, 8, 16])
        rewards = [rng.choice([0.0, 1.0, 0.5]) for _ in range(size * rng.randint(1, 5))]
        assert pass_at_k(rewards, size) == pytest.approx(slime_pass_rate(rewards, size))
    assert pass_at_k([1.0, 0.0], 1) == {} == slime_pass_rate([1.0, 0.0], 1)


def test_the_local_runs_evaluation_is_over_the_answered_episodes(
    services: dict[str, str], tmp_path: Path
) -> None:
    """Three episodes of one question: two answered right, one the engine refused. The local
    run's evaluation read 0.667; 1.0 now, the aborted one said beside it."""
    from deepdive.local.model import train_tokenizer

    tokenizer = train_tokenizer(["who made the orrery search finish"] * 20, vocab_size=300)
    config = load_local_config(None, ["eval.samples=3", "rollout.retries=0"])
    output = io.StringIO()
    run = RunContext(config, RunPaths(tmp_path), Console(file=output, width=300))
    refused = ScriptedTurn("", status=400, message="too long")
    script = [ScriptedTurn(FINISH), refused, ScriptedTurn(FINISH)]
    row = {
        "input_messages": [{"role": "user", "content": FORBIDDEN_QUESTION}],
        "label": "Ilse Varen",
        "metadata": {"remote_env_info": {"forbidden_texts": [FORBIDDEN_QUESTION]}},
    }
    with serve_in_thread(FakeSGLang(script).app()) as sglang:
        settings = settings_for(config, sglang, (services["tools"],), services["reward"])
        args = rollout_args(settings, tokenizer)
        rollouts = InProcessRollouts(engine=None, args={WORLD: args})
        held_out = Evaluation("held-out", WORLD, [row])
        values = evaluate(run, rollouts, [held_out], "after GRPO", 1)
    assert values == {"held-out": 1.0}
    assert "1 of 3 ABORTED, not counted" in output.getvalue()
