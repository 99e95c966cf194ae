"""`deepdive run`: the whole pipeline on one machine, with no GPU, keys or cluster.

world -> prompt rows (the real converter) -> tokenizer and tiny policy -> the tool server
(offline, on the world's corpus) and the reward server (rule judge) as child processes, the
local engine in-process -> supervised warm start -> held-out evaluation -> GRPO steps (the same
`generate_with_tool` and `reward_func` slime calls) with checkpoints -> held-out evaluation ->
final model, reward plot, summary. A run folder with a checkpoint resumes where it stopped.
Each stage lives in a module of its own; this one puts them in order.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from rich.console import Console

from deepdive.convert.rows import AtomicJsonlWriter
from deepdive.local.config import LocalRunConfig
from deepdive.local.context import RunContext
from deepdive.local.data import prepare_data
from deepdive.local.episodes import UNSEEN, WORLD, Evaluation
from deepdive.local.paths import resume_point
from deepdive.local.policy import build_policy
from deepdive.local.prompts import read_prompt_rows
from deepdive.local.rollouts import Rollouts, local_rollouts
from deepdive.local.training import train
from deepdive.run_paths import RunPaths

# Rollouts played elsewhere than this process (a Slurm job's nodes): given the run's config,
# its folder and how to report, a context manager that yields them.
RolloutsFactory = Callable[
    [LocalRunConfig, RunPaths, Callable[[str], None]], AbstractContextManager[Rollouts]
]


class LocalRun:
    def __init__(
        self,
        config: LocalRunConfig,
        console: Console | None = None,
        cluster: RolloutsFactory | None = None,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.context = RunContext(
            config, RunPaths(Path(config.run.out)), console or Console(stderr=True), on_event
        )
        self.cluster = cluster

    def run(self) -> dict[str, Any]:
        import torch

        run = self.context
        config, paths = run.config, run.paths
        started = time.monotonic()
        torch.set_num_threads(config.run.threads or os.cpu_count() or 1)
        resumed = resume_point(config, run.config_dict, paths)
        paths.root.mkdir(parents=True, exist_ok=True)
        manifest = prepare_data(config, paths)
        run.say(
            f"world: {manifest['documents']} pages, {manifest['demonstrations']} demonstrations, "
            f"{manifest['train']} train and {manifest['eval']} held-out questions in {paths.world}"
        )
        model, tokenizer = build_policy(config, paths)
        random.seed(config.run.seed)
        torch.manual_seed(config.run.seed)
        train_rows = read_prompt_rows(paths.data / "train.jsonl")
        eval_rows = read_prompt_rows(paths.data / "eval.jsonl")
        if config.eval.questions:
            eval_rows = eval_rows[: config.eval.questions]
        unseen_rows = (
            read_prompt_rows(paths.data / "unseen.jsonl") if config.eval.unseen_questions else []
        )
        evaluations = [Evaluation("held-out", WORLD, eval_rows)]
        if unseen_rows:
            run.say(f"unseen world: {len(unseen_rows)} questions")
            evaluations.append(Evaluation("unseen", UNSEEN, unseen_rows))
        if self.cluster is None:
            unseen_world = paths.unseen_world if unseen_rows else None
            playing: AbstractContextManager[Rollouts] = local_rollouts(
                config, model, tokenizer, paths.world, unseen_world, paths.logs, run.say
            )
        else:
            playing = self.cluster(config, paths, run.say)
        with playing as rollouts:
            run.event("training started")
            summary = train(run, model, tokenizer, rollouts, train_rows, evaluations, resumed)
        summary["world"] = manifest
        summary["wall_s"] = round(time.monotonic() - started, 1)
        summary["paths"] = {
            "run": str(paths.root),
            "metrics": str(paths.metrics),
            "tensorboard": str(paths.tensorboard),
            "checkpoints": str(paths.checkpoints),
            "final_model": str(paths.final_model),
            "plot": str(paths.plot),
            "summary": str(paths.summary),
        }
        with AtomicJsonlWriter(paths.summary) as writer:
            writer.write(summary)
        return summary
