"""`deepdive eval CONFIG --checkpoint PATH|latest [...] --data eval.jsonl [--samples K]`: every
checkpoint served in turn, the same `generate_with_tool` and `reward_func` over the eval set,
against the same services training uses (the backend's, started here on loopback).

A checkpoint is served by the local engine (backend local: a Hugging Face folder such as
RUN/final_model, or a training checkpoint RUN/checkpoints/step-NNNNNN on the run's base model)
or by SGLang (backend slime: a Hugging Face folder, e.g. what `deepdive convert-checkpoint
to-hf` wrote; SGLang must be installed: the training image on a GPU node). `latest` is the
run's newest: RUN/final_model or its newest step checkpoint (local), the Hugging Face
conversion of the newest complete training checkpoint (slime).

SGLang serves each checkpoint with the context training used (`--context-length`,
slurm/backends/slime/model_context.py): an episode longer than the checkpoint's config.json allows is refused
before SGLang starts, not turn by turn. The services get the env file's keys
(`services.env_file`: the search keys, the service token) as training's nodes give them, and
this process sends the file's token.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from deepdive.rollout_settings import RolloutKnobs, RolloutSettings, rollout_args
from services.exceptions import ConfigError
from services.files import atomic_write_bytes
from services.logs import register_secret
from services.process import ServiceProcess
from services.secrets import TOKEN_ENV, load_env_file
from slurm.backends import build_backend
from slurm.backends.slime.args import sglang_context_length
from slurm.backends.slime.model_context import (
    check_episode_fits,
    model_context,
    read_config,
    served_context,
)
from slurm.config import ExperimentConfig, local_run_config
from slurm.eval_report import episode_row, print_table, summarize


@dataclass(frozen=True)
class Checkpoint:
    name: str  # as the table shows it
    path: Path
    kind: str  # hf (a Hugging Face folder) | step (a local training checkpoint)


def resolve(config: ExperimentConfig, spec: str) -> Checkpoint:
    run = Path(config.run.folder)
    if spec == "latest":
        if config.run.backend == "local":
            final = run / "final_model"
            if (final / "config.json").is_file():
                return Checkpoint("latest (final_model)", final, "hf")
            from deepdive.local.checkpoint import checkpoints

            found = checkpoints(run / "checkpoints")
            if not found:
                raise ConfigError(f"--checkpoint latest: {run} has no checkpoint yet")
            return Checkpoint(f"latest ({found[-1].name})", found[-1], "step")
        from slurm.backends.slime.conversion import converted, iteration_folder

        number, _ = iteration_folder(config, "latest")
        path = converted(config) / f"iter_{number:07d}_hf"
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"--checkpoint latest: iteration {number} has no Hugging Face conversion at "
                f"{path}; run `deepdive convert-checkpoint to-hf CONFIG --iteration {number}`"
            )
        return Checkpoint(f"latest (iter {number})", path, "hf")
    path = Path(spec).expanduser().absolute()
    if (path / "config.json").is_file():
        return Checkpoint(path.name, path, "hf")
    if (path / "state.pt").is_file() and config.run.backend == "local":
        return Checkpoint(path.name, path, "step")
    raise ConfigError(
        f"--checkpoint {spec}: not a Hugging Face model folder (config.json)"
        + (" nor a training checkpoint (state.pt)" if config.run.backend == "local" else "")
    )


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"--data {path}: no such file")
    rows = []
    for line_number, line in enumerate(path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise ConfigError(f"--data {path}, line {line_number}: not JSON") from None
        if not isinstance(row, dict) or "input_messages" not in row or "label" not in row:
            raise ConfigError(
                f"--data {path}, line {line_number}: expected a prompt row (input_messages, "
                "label: what `deepdive convert` writes)"
            )
        rows.append(row)
    if not rows:
        raise ConfigError(f"--data {path}: no rows to evaluate")
    return rows


def env_file_values(config: ExperimentConfig) -> dict[str, str]:
    """`services.env_file`'s values, registered for log redaction (as the job's nodes do)."""
    path = config.services.env_file
    values = load_env_file(path) if path else {}
    for value in values.values():
        register_secret(value)
    return values


@contextmanager
def services(config: ExperimentConfig, logs: Path) -> Iterator[dict[str, str]]:
    """The backend's services on loopback (free ports), with the env file's keys, for the
    duration of the evaluation; the rollout here sends the file's service token."""
    secrets = env_file_values(config)
    with ExitStack() as stack:
        if TOKEN_ENV in secrets and not os.environ.get(TOKEN_ENV):
            os.environ[TOKEN_ENV] = secrets[TOKEN_ENV]  # deepdive.clients reads it
            stack.callback(os.environ.pop, TOKEN_ENV, None)
        urls = {}
        for spec in build_backend(config).services():
            arguments = [*spec.command_arguments(cores=None), "--host", "127.0.0.1"]
            process = ServiceProcess(
                spec.name, arguments, logs / f"{spec.name}.log", environment=secrets
            )
            urls[spec.name] = stack.enter_context(process).url
        yield urls


@contextmanager
def serve(
    config: ExperimentConfig, checkpoint: Checkpoint, logs: Path
) -> Iterator[tuple[str, Any]]:
    """The checkpoint behind SGLang's /generate: (its URL, the tokenizer the rollout uses,
    or None when the rollout loads it from args.hf_checkpoint)."""
    if config.run.backend == "slime":
        from slurm.backends.slime.sglang_server import sglang_server

        context = check_served_context(config, checkpoint.path)
        tensor = config.slime.resources.rollout_num_gpus_per_engine
        with sglang_server(checkpoint.path, logs / "sglang.log", context, tensor) as url:
            yield url, None
        return
    from deepdive.local.model import load_model
    from deepdive.local.stack import engine_server

    local = local_run_config(config)
    if checkpoint.kind == "step":
        from deepdive.local.checkpoint import load_checkpoint

        model, tokenizer = load_model(Path(local.run.out) / "base_model")
        _, state = load_checkpoint(checkpoint.path)
        model.load_state_dict(state["trainer"]["model"])
    else:
        model, tokenizer = load_model(checkpoint.path)
    with engine_server(model, tokenizer, local.rollout.max_batch) as (url, _engine):
        yield url, tokenizer


def check_served_context(config: ExperimentConfig, model: Path) -> int:
    """The context SGLang serves `model` with for this evaluation (training's), refusing one
    the model's config.json does not allow or that an episode would not fit."""
    slime = config.slime
    context = model_context(read_config(model), str(model / "config.json"))
    served = served_context(context, slime.sglang.context_length, "slime.sglang.context_length")
    check_episode_fits(
        context,
        served,
        slime.rollout.max_context_len,
        slime.rollout.max_response_len,
        "slime.rollout.max_context_len",
        "slime.rollout.max_response_len",
    )
    return sglang_context_length(slime)  # what training's SGLang served (<= `served`)


def rollout_limits(config: ExperimentConfig) -> tuple[RolloutKnobs, int, int]:
    """What training's rollout uses: its knobs (max turns, malformed policy, timeouts, retries),
    the episode's context and the response budget."""
    if config.run.backend == "local":
        rollout = local_run_config(config).rollout
        return rollout.knobs(), rollout.max_context_tokens, rollout.max_response_tokens
    slime = config.slime
    return slime.deepdive.knobs(), slime.rollout.max_context_len, slime.rollout.max_response_len


def evaluate(
    config: ExperimentConfig,
    checkpoints: list[Checkpoint],
    rows: list[dict[str, Any]],
    samples: int,
    temperature: float,
    out: Path,
    console: Console,
) -> dict[str, dict[str, Any]]:
    from deepdive.local.episodes import rollout_batch

    if config.run.backend == "slime":  # before anything starts: each checkpoint's context
        for checkpoint in checkpoints:
            check_served_context(config, checkpoint.path)
    knobs, context, budget = rollout_limits(config)
    params = {"max_new_tokens": budget, "temperature": temperature, "top_p": 1.0}
    summaries: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    with services(config, out / "logs") as urls:
        for checkpoint in checkpoints:
            with serve(config, checkpoint, out / "logs") as (sglang, tokenizer):
                settings = RolloutSettings.of(
                    knobs,
                    sglang_url=sglang,
                    tool_server_url=urls["tools"],
                    reward_server_url=urls["reward"],
                    max_context_tokens=context,
                )
                args = rollout_args(settings, tokenizer)
                if tokenizer is None:
                    args.hf_checkpoint = str(checkpoint.path)
                played = asyncio.run(rollout_batch(args, rows, samples, params, "eval"))
            episodes = [
                episode_row(checkpoint.name, rows[s.index // samples], s, samples) for s in played
            ]
            results += episodes
            summaries[checkpoint.name] = {
                "path": str(checkpoint.path),
                **summarize(episodes, samples),
            }
            console.print(
                f"{checkpoint.name}: accuracy {summaries[checkpoint.name]['accuracy']:.3f} "
                f"over {len(episodes)} episodes"
            )
    atomic_write_bytes(out / "results.jsonl", b"".join(orjson.dumps(r) + b"\n" for r in results))
    atomic_write_bytes(out / "summary.json", orjson.dumps(summaries, option=orjson.OPT_INDENT_2))
    print_table(summaries, samples, console)
    return summaries
