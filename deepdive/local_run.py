"""`deepdive run`: the whole pipeline on one machine, with no GPU, keys or cluster.

world -> prompt rows (the real converter) -> tokenizer and tiny policy -> the tool server
(offline, on the world's corpus) and the reward server (rule judge) as child processes, the
local engine in-process -> supervised warm start -> held-out evaluation -> GRPO steps (the same
`generate_with_tool` and `reward_func` slime calls) with checkpoints -> held-out evaluation ->
final model, reward plot, summary. A run folder with a checkpoint resumes where it stopped.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import random
import shutil
import time
from argparse import Namespace
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from deepdive.checkpoint import load_latest, restore_rng, rng_state, save_checkpoint
from deepdive.clients import close_clients
from deepdive.command import write_world
from deepdive.convert import AtomicJsonlWriter, convert
from deepdive.grpo import group_advantages, scoring_temperature
from deepdive.local_config import LocalRunConfig
from deepdive.prompts import PromptSampler, read_prompt_rows, sample_from_row
from deepdive.protocol import SYSTEM_PROMPTS
from deepdive.rollout import generate_with_tool, reward_func
from deepdive.rollout_settings import RolloutSettings, rollout_args
from deepdive.run_log import RunLog, plot_rewards
from deepdive.sample import status_name
from deepdive.trainer import Example, OptimizerSettings, PolicyTrainer
from deepdive.warm_start import (
    DemonstrationExamples,
    copy_warm_up,
    read_demonstrations,
    tokenizer_texts,
    warm_start,
)
from deepdive.world import WorldSizes, unseen_world_seed
from services.exceptions import ConfigError
from services.process import ServiceProcess
from services.serve import bind, start_server_thread

# What a resumed run may change; any other change makes it a different run.
RESUMABLE_KEYS = {"grpo.steps", "checkpoint.every", "checkpoint.keep", "run.resume", "run.threads"}
RESUMABLE_SECTIONS = {"eval"}


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def world(self) -> Path:
        return self.root / "world"

    @property
    def unseen_world(self) -> Path:
        return self.root / "unseen_world"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def base_model(self) -> Path:
        return self.root / "base_model"

    @property
    def final_model(self) -> Path:
        return self.root / "final_model"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def plot(self) -> Path:
        return self.root / "reward_curve.png"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Keys whose values differ, except those a resumed run may change."""
    return [
        f"{section}.{key}"
        for section, values in current.items()
        if section not in RESUMABLE_SECTIONS
        for key, value in values.items()
        if f"{section}.{key}" not in RESUMABLE_KEYS and saved.get(section, {}).get(key) != value
    ]


def prepare_data(config: LocalRunConfig, paths: RunPaths) -> dict[str, Any]:
    """The world, then train/eval prompt rows through the real converter (max_hops applied)."""
    world = config.world
    manifest = write_world(paths.world, world.seed, world)
    needed = {"train": "training question", "eval": "held-out question"}
    if config.warm_start.epochs:
        needed["demonstrations"] = "demonstration for the warm start"
    for key, what in needed.items():
        if not manifest[key]:
            raise ConfigError(
                f"this world has no {what}: a bigger world (world.people, world.artifacts, "
                "...) or a larger world.max_hops makes room for more"
            )
    system_prompt = SYSTEM_PROMPTS[config.rollout.system_prompt]
    for split in ("train", "eval"):
        convert(
            paths.world / f"qa_{split}.jsonl",
            paths.data / f"{split}.jsonl",
            source="world",
            strict=True,
            system_prompt=system_prompt,
        )
    if config.eval.unseen_questions:
        sizes = {item.name: getattr(world, item.name) for item in dataclasses.fields(WorldSizes)}
        unseen = WorldSizes(
            **{
                **sizes,
                "sft_questions": 0,
                "train_questions": 0,
                "eval_questions": config.eval.unseen_questions,
                "sft_worlds": 0,
            }
        )
        if not write_world(paths.unseen_world, unseen_world_seed(world.seed), unseen)["eval"]:
            raise ConfigError(
                "the unseen world has no question for eval.unseen_questions: a bigger world "
                "(world.people, world.artifacts, ...) makes room for some"
            )
        convert(
            paths.unseen_world / "qa_eval.jsonl",
            paths.data / "unseen.jsonl",
            source="world",
            strict=True,
            system_prompt=system_prompt,
        )
    return manifest


def build_policy(config: LocalRunConfig, paths: RunPaths) -> tuple[Any, Any]:
    """The run's base model and tokenizer, made once and kept in the run folder."""
    from transformers.utils import logging as transformers_logging

    from deepdive.local_model import load_model, new_model, train_tokenizer

    transformers_logging.disable_progress_bar()

    if not (paths.base_model / "config.json").is_file():
        if config.model.path:
            model, tokenizer = load_model(config.model.path)
        else:
            demonstrations = read_demonstrations(paths.world / "demonstrations.jsonl")
            system_prompt = SYSTEM_PROMPTS[config.rollout.system_prompt]
            texts = tokenizer_texts(paths.world / "corpus.jsonl", demonstrations, system_prompt)
            tokenizer = train_tokenizer(texts, config.model.vocab_size)
            model = new_model(
                tokenizer,
                seed=config.run.seed,
                hidden=config.model.hidden,
                layers=config.model.layers,
                heads=config.model.heads,
                context=max(4096, config.rollout.max_context_tokens),
            )
        partial = paths.base_model.with_name(paths.base_model.name + ".tmp")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        shutil.rmtree(paths.base_model, ignore_errors=True)
        partial.rename(paths.base_model)
    return load_model(paths.base_model)


def tool_server(world: Path, log: Path) -> ServiceProcess:
    """The tool server over one world's pages (offline search and reader)."""
    command = ["tools", "--search", "offline", "--reader", "offline", "--no-index-cache"]
    command += ["--corpus", str(world / "corpus.jsonl"), "--log-level", "WARNING"]
    return ServiceProcess("tool", command, log)


@dataclass(frozen=True)
class Evaluation:
    """Questions to score before and after GRPO, and the services that answer them (`args`)."""

    name: str  # "held-out": this world's qa_eval; "unseen": another world's
    args: Namespace
    rows: list[dict[str, Any]]


@contextmanager
def engine_server(model: Any, tokenizer: Any, max_batch: int) -> Iterator[tuple[str, Any]]:
    """The local engine on a loopback port, in this process (weights are synced in memory)."""
    from deepdive.engine import LocalEngine, create_engine_app

    engine = LocalEngine(copy.deepcopy(model), tokenizer, max_batch=max_batch)
    sock = bind("127.0.0.1", 0)
    stop = start_server_thread(create_engine_app(engine), sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", engine
    finally:
        stop()


def _seed_for(*parts: object) -> int:
    return random.Random(":".join(str(p) for p in parts)).getrandbits(31)


async def rollout_batch(
    args: Namespace, rows: list[dict[str, Any]], group_size: int, params: dict[str, Any], seed: str
) -> list[Any]:
    """Rollouts for each row x group_size, concurrently, then their rewards (batched per step)."""
    samples = [
        sample_from_row(row, group_index=g, index=g * group_size + i)
        for g, row in enumerate(rows)
        for i in range(group_size)
    ]
    runs = [
        generate_with_tool(args, sample, {**params, "sampling_seed": _seed_for(seed, sample.index)})
        for sample in samples
    ]
    samples = list(await asyncio.gather(*runs))
    rewards = await reward_func(args, samples)
    assert isinstance(rewards, list)
    for sample, reward in zip(samples, rewards, strict=True):
        sample.reward = reward
    await close_clients()
    return samples


def rollout_metrics(samples: list[Any], group_size: int) -> dict[str, Any]:
    rewards = [float(s.reward) for s in samples]
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    stats = [s.metadata.get("deepdive", {}) for s in samples]
    calls: Counter[str] = Counter()
    for item in stats:
        calls.update(item.get("tool_calls", {}))
    statuses = Counter(status_name(s) for s in samples)
    count = len(samples)
    return {
        "reward_mean": sum(rewards) / count,
        "pass_at_n": sum(1 for g in groups if max(g) > 0) / len(groups),
        "solved_groups_all": sum(1 for g in groups if min(g) > 0) / len(groups),
        "turns_mean": sum(item.get("turns", 0) for item in stats) / count,
        "tool_calls_mean": sum(v for k, v in calls.items() if k != "malformed") / count,
        "malformed_mean": calls.get("malformed", 0) / count,
        "response_tokens_mean": sum(s.response_length for s in samples) / count,
        "model_tokens_mean": sum(sum(s.loss_mask or []) for s in samples) / count,
        **{f"status_{k.lower()}": v / count for k, v in sorted(statuses.items())},
    }


def examples_from(samples: list[Any], advantages: list[float]) -> list[Example]:
    return [
        Example(
            tokens=list(s.tokens),
            prompt_length=len(s.tokens) - s.response_length,
            loss_mask=list(s.loss_mask or []),
            old_logprobs=list(s.rollout_log_probs or []),
            advantage=advantage,
        )
        for s, advantage in zip(samples, advantages, strict=True)
        if s.response_length > 0
    ]


class LocalRun:
    def __init__(self, config: LocalRunConfig, console: Console | None = None) -> None:
        self.config = config
        self.paths = RunPaths(Path(config.run.out))
        self.console = console or Console(stderr=True)
        self.config_dict = dataclasses.asdict(config)

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def _check_resume(self) -> tuple[int, dict[str, Any]] | None:
        latest = load_latest(self.paths.checkpoints)
        if latest is None:
            return None
        if not self.config.run.resume:
            raise ConfigError(
                f"run.resume = false, but {self.paths.checkpoints} holds checkpoints: choose "
                "another run.out, or delete that folder, to start over"
            )
        changed = config_changes(latest[1]["config"], self.config_dict)
        if changed:
            raise ConfigError(
                f"{self.paths.root} was started with another configuration ({', '.join(changed)} "
                "changed): a resumed run must be the same run; choose another run.out"
            )
        return latest

    def run(self) -> dict[str, Any]:
        import torch

        config, paths = self.config, self.paths
        started = time.monotonic()
        torch.set_num_threads(config.run.threads or os.cpu_count() or 1)
        resumed = self._check_resume()
        paths.root.mkdir(parents=True, exist_ok=True)
        manifest = prepare_data(config, paths)
        self.say(
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
            reward = stack.enter_context(
                ServiceProcess(
                    "reward",
                    ["reward", "--judge", "rule", "--log-level", "WARNING"],
                    paths.logs / "reward_server.log",
                )
            )
            sglang, engine = stack.enter_context(
                engine_server(model, tokenizer, config.rollout.max_batch)
            )
            self.say(f"services: tools {tools.url}, reward {reward.url}, engine {sglang}")
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
                self.say(f"unseen world: {len(unseen_rows)} questions, tools {unseen_tools.url}")
                unseen = dataclasses.replace(settings, tool_server_url=unseen_tools.url)
                evaluations.append(
                    Evaluation("unseen", rollout_args(unseen, tokenizer), unseen_rows)
                )
            summary = self._train(model, tokenizer, engine, train_rows, evaluations, resumed)
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

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.console.is_terminal,
        )

    def _sampling(self, temperature: float) -> dict[str, Any]:
        return {
            "max_new_tokens": self.config.rollout.max_response_tokens,
            "temperature": temperature,
            "top_p": self.config.rollout.top_p,
        }

    def _evaluate(self, evaluations: list[Evaluation], when: str) -> dict[str, float]:
        """The mean reward of each evaluation's questions x eval.samples."""
        temperature = self.config.eval.temperature
        values = {}
        for evaluation in evaluations:
            seed = f"{self.config.run.seed}:eval"
            if evaluation.name != "held-out":
                seed += f":{evaluation.name}"
            samples = asyncio.run(
                rollout_batch(
                    evaluation.args,
                    evaluation.rows,
                    self.config.eval.samples,
                    self._sampling(temperature),
                    seed,
                )
            )
            value = sum(float(s.reward) for s in samples) / max(1, len(samples))
            values[evaluation.name] = value
            self.say(
                f"{evaluation.name} reward {when}: {value:.3f} ({len(evaluation.rows)} questions "
                f"x {self.config.eval.samples}, temperature {temperature})"
            )
        return values

    def _train(
        self,
        model: Any,
        tokenizer: Any,
        engine: Any,
        train_rows: list[dict[str, Any]],
        evaluations: list[Evaluation],
        resumed: tuple[int, dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """Warm start (or resume), GRPO steps, and the evaluations before and after.
        The first evaluation is this world's held-out questions, on the services GRPO uses."""
        config, paths = self.config, self.paths
        grpo = config.grpo
        args = evaluations[0].args
        sampler = PromptSampler(len(train_rows), config.run.seed)
        summary: dict[str, Any] = {}
        if resumed is None:
            summary["warm_start"] = self._warm_start(model, tokenizer)
            engine.load_state_dict(model.state_dict())
            before: dict[str, float] = {}
            if config.eval.before:
                before = self._evaluate(evaluations, "after the warm start")
            start_step = 0
        settings = OptimizerSettings(
            grpo.lr, grpo.weight_decay, grpo.max_grad_norm, grpo.micro_batch
        )
        reference = PolicyTrainer.frozen_copy(model) if grpo.kl_coef > 0 else None
        trainer = PolicyTrainer(model, tokenizer.pad_token_id, settings, reference)
        if resumed is None:
            self._save(0, trainer, sampler, before, summary.get("warm_start"))
        else:
            start_step, state = resumed
            trainer.load_state_dict(state["trainer"])
            sampler.restore(state["sampler"])
            restore_rng(state["rng"])
            before = state["eval_before"]
            summary["warm_start"] = state.get("warm_start")
            engine.load_state_dict(model.state_dict())
            self.say(f"resumed from {paths.checkpoints} at step {start_step}")
        log = RunLog(paths.logs, resume_after_step=start_step if resumed else None)
        totals = {"rollout_s": 0.0, "update_s": 0.0, "sync_s": 0.0}
        with self._progress() as progress:
            task = progress.add_task("GRPO", total=grpo.steps, completed=start_step, info="")
            for step in range(start_step + 1, grpo.steps + 1):
                metrics = self._grpo_step(step, trainer, engine, args, train_rows, sampler)
                for key in totals:
                    totals[key] += metrics[key]
                log.write(step, metrics)
                progress.update(task, advance=1, info=f"reward {metrics['reward_mean']:.2f}")
                if not self.console.is_terminal:
                    self.say(
                        f"step {step}/{grpo.steps}: reward {metrics['reward_mean']:.3f} "
                        f"pass@{grpo.samples_per_prompt} {metrics['pass_at_n']:.2f} "
                        f"turns {metrics['turns_mean']:.1f} rollout {metrics['rollout_s']:.1f}s "
                        f"update {metrics['update_s']:.1f}s"
                    )
                if step % config.checkpoint.every == 0 or step == grpo.steps:
                    self._save(step, trainer, sampler, before, summary.get("warm_start"))
        after = self._evaluate(evaluations, "after GRPO")
        rows = log.rows()
        log.close()
        model.save_pretrained(paths.final_model)
        tokenizer.save_pretrained(paths.final_model)
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
                "eval_episodes": len(evaluations[0].rows) * self.config.eval.samples,
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

    def _warm_start(self, model: Any, tokenizer: Any) -> dict[str, Any]:
        """On the demonstrations of the qa_sft questions, which GRPO never samples."""
        section, seed = self.config.warm_start, self.config.run.seed
        examples = DemonstrationExamples(
            read_demonstrations(self.paths.world / "demonstrations.jsonl"),
            tokenizer,
            SYSTEM_PROMPTS[self.config.rollout.system_prompt],
            section.observation_weight,
            section.rename,
            seed,
        )

        def new_trainer(lr: float) -> PolicyTrainer:
            settings = OptimizerSettings(lr, 0.0, 1.0, self.config.grpo.micro_batch)
            return PolicyTrainer(model, tokenizer.pad_token_id, settings)

        started = time.monotonic()
        copy_history: list[dict[str, float]] = []
        with self._progress() as progress:
            task = progress.add_task("copy warm-up", total=None, info="")

            def on_step(step: int, total: int, metrics: dict[str, float]) -> None:
                progress.update(
                    task, completed=step, total=total, info=f"loss {metrics['loss']:.3f}"
                )
                if not self.console.is_terminal and (step % 10 == 0 or step == total):
                    name = progress.tasks[task].description
                    self.say(f"{name} {step}/{total}: loss {metrics['loss']:.3f}")

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

    def _grpo_step(
        self,
        step: int,
        trainer: PolicyTrainer,
        engine: Any,
        args: Namespace,
        train_rows: list[dict[str, Any]],
        sampler: PromptSampler,
    ) -> dict[str, Any]:
        grpo = self.config.grpo
        started = time.monotonic()
        rows = [train_rows[i] for i in sampler.take(grpo.prompts_per_step)]
        samples = asyncio.run(
            rollout_batch(
                args,
                rows,
                grpo.samples_per_prompt,
                self._sampling(self.config.rollout.temperature),
                f"{self.config.run.seed}:{step}",
            )
        )
        rollout_s = time.monotonic() - started
        rewards = [float(s.reward) for s in samples]
        advantages = group_advantages(rewards, grpo.samples_per_prompt, grpo.normalize_std)
        examples = examples_from(samples, advantages)
        started = time.monotonic()
        update: dict[str, float] = {}
        chunk = max(1, len(examples) // grpo.updates_per_step)
        for start in range(0, len(examples), chunk):
            parts = trainer.grpo_step(
                examples[start : start + chunk],
                grpo.clip_low,
                grpo.clip_high,
                grpo.kl_coef,
                grpo.per_token_loss,
                scoring_temperature(self.config.rollout.temperature),
            )
            for key, value in parts.items():
                update[key] = update.get(key, 0.0) + value / grpo.updates_per_step
        update_s = time.monotonic() - started
        started = time.monotonic()
        engine.load_state_dict(trainer.model.state_dict())
        sync_s = time.monotonic() - started
        return {
            **rollout_metrics(samples, grpo.samples_per_prompt),
            **dict(update),
            "rollout_s": rollout_s,
            "update_s": update_s,
            "sync_s": sync_s,
        }

    def _save(
        self,
        step: int,
        trainer: PolicyTrainer,
        sampler: PromptSampler,
        eval_before: dict[str, float],
        warm_start_summary: dict[str, Any] | None,
    ) -> None:
        state = {
            "trainer": trainer.state_dict(),
            "sampler": sampler.state(),
            "rng": rng_state(),
            "eval_before": eval_before,  # evaluation name -> reward after the warm start
            "warm_start": warm_start_summary,
            "config": self.config_dict,
        }
        save_checkpoint(self.paths.checkpoints, step, state, self.config.checkpoint.keep)


def print_summary(summary: dict[str, Any], console: Console) -> None:
    """The end of a run: what it reached, and where everything is."""
    from rich.table import Table

    def number(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    table = Table(title="deepdive run", show_header=False)
    warm = summary.get("warm_start") or {}
    rows = [
        (
            "warm start",
            f"{warm.get('steps', '-')} steps, final loss {number(warm.get('final_loss'))}",
        ),
        ("held-out reward after warm start", number(summary.get("eval_reward_before"))),
        ("held-out reward after GRPO", number(summary.get("eval_reward_after"))),
    ]
    if "unseen_reward_after" in summary:
        rows += [
            ("unseen-world reward after warm start", number(summary.get("unseen_reward_before"))),
            ("unseen-world reward after GRPO", number(summary.get("unseen_reward_after"))),
        ]
    rows += [
        ("training reward, first step", number(summary.get("train_reward_first"))),
        ("training reward, last 5 steps", number(summary.get("train_reward_last5"))),
        ("GRPO steps per minute", number(summary.get("steps_per_minute"))),
        (
            "rollout / update / sync s",
            " / ".join(number(v) for v in (summary.get("time_split_s") or {}).values()),
        ),
        ("wall time", f"{summary.get('wall_s')} s"),
    ]
    rows += [(name, path) for name, path in (summary.get("paths") or {}).items()]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
