"""`deepdive run`: the whole pipeline on one machine, with no GPU, keys or cluster.

world -> prompt rows (the real converter) -> tokenizer and tiny policy -> the tool server
(offline, on the world's corpus) and the reward server (rule judge) as child processes, the
local engine in-process -> supervised warm start -> held-out evaluation -> GRPO steps (the same
`generate_with_tool` and `reward_func` slime calls) with checkpoints -> held-out evaluation ->
final model, reward plot, summary. A run folder with a checkpoint resumes where it stopped.
Each stage lives in a module of its own; this one puts them in order.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from deepdive.convert import AtomicJsonlWriter
from deepdive.local.config import LocalRunConfig
from deepdive.local.context import RunContext
from deepdive.local.data import prepare_data
from deepdive.local.episodes import Evaluation
from deepdive.local.paths import RunPaths, resume_point
from deepdive.local.policy import build_policy
from deepdive.local.prompts import read_prompt_rows
from deepdive.local.stack import engine_server, reward_server, tool_server
from deepdive.local.training import train
from deepdive.rollout_settings import RolloutSettings, rollout_args


class LocalRun:
    def __init__(self, config: LocalRunConfig, console: Console | None = None) -> None:
        self.context = RunContext(
            config, RunPaths(Path(config.run.out)), console or Console(stderr=True)
        )

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
        with ExitStack() as stack:
            tools = stack.enter_context(tool_server(paths.world, paths.logs / "tool_server.log"))
            reward = stack.enter_context(reward_server(paths.logs / "reward_server.log"))
            sglang, engine = stack.enter_context(
                engine_server(model, tokenizer, config.rollout.max_batch)
            )
            run.say(f"services: tools {tools.url}, reward {reward.url}, engine {sglang}")
            settings = RolloutSettings(
                sglang_url=sglang,
                tool_server_url=tools.url,
                reward_server_url=reward.url,
                max_turns=config.rollout.max_turns,
                max_context_tokens=config.rollout.max_context_tokens,
                on_malformed=config.rollout.on_malformed,
            )
            args = rollout_args(settings, tokenizer)
            evaluations = [Evaluation("held-out", args, eval_rows)]
            if unseen_rows:
                unseen_tools = stack.enter_context(
                    tool_server(paths.unseen_world, paths.logs / "unseen_tool_server.log")
                )
                run.say(f"unseen world: {len(unseen_rows)} questions, tools {unseen_tools.url}")
                unseen = dataclasses.replace(settings, tool_server_url=unseen_tools.url)
                evaluations.append(
                    Evaluation("unseen", rollout_args(unseen, tokenizer), unseen_rows)
                )
            summary = train(run, model, tokenizer, engine, train_rows, evaluations, resumed)
        summary["world"] = manifest
        summary["wall_s"] = round(time.monotonic() - started, 1)
        summary["paths"] = {
            "run": str(paths.root),
            "metrics": str(paths.logs / "metrics.jsonl"),
            "tensorboard": str(paths.logs / "tensorboard"),
            "checkpoints": str(paths.checkpoints),
            "final_model": str(paths.final_model),
            "plot": str(paths.plot),
            "summary": str(paths.summary),
        }
        with AtomicJsonlWriter(paths.summary) as writer:
            writer.write(summary)
        return summary
