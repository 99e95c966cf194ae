"""`deepdive eval CONFIG --checkpoint PATH|latest [...] --data eval.jsonl [--samples K]`: every
checkpoint served in turn, the same `generate_with_tool` and `reward_func` over the eval set,
against the same services training uses (the backend's, started here on loopback).

A checkpoint is served by the backend's engine (`Backend.eval_engine`): the local engine for
backend local (slurm/backends/local_eval.py), SGLang for backend slime
(slurm/backends/slime/eval_engine.py), each saying what a checkpoint and `latest` are and
refusing, before anything starts, one it cannot serve training's episodes with. The episodes
are training's: its rollout knobs, context and response budget. The services get the env
file's keys (`services.env_file`: the search keys, the service token) as training's nodes give
them, and this process sends the file's token.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from deepdive.aborts import aborted_errors
from deepdive.messages import most_said
from deepdive.rollout_settings import RolloutSettings, rollout_args
from services.base.errors import ConfigError, RuntimeFailure
from services.base.files import atomic_write_bytes
from services.base.process import ServiceProcess
from services.base.secrets import TOKEN_ENV, load_secrets
from slurm.backends import Checkpoint, build_backend
from slurm.config import ExperimentConfig
from slurm.launch.eval_report import episode_row, print_table, summarize

# an evaluation mostly ABORTED measures SGLang, not the checkpoint: its accuracy is no figure
EVAL_HINTS = (
    "Its accuracy is over the few episodes left: it measures the engine, not the checkpoint. "
    "Check the engine's log in the eval folder's logs/ (a context too long for the model, "
    "--rollout-top-p below 1 on an SGLang without slime's patch, an engine that died). The "
    "limit is the backend's max_aborted_share (slime.deepdive or local.rollout)."
)


def too_many_aborted(checkpoint: str, played: list[Any], limit: float) -> str | None:
    """What to say when more of a checkpoint's episodes ABORTED than `limit` allows (the
    backend's max_aborted_share, as in training): the count and the engine's words."""
    errors = aborted_errors(played)
    aborted = sum(errors.values())
    if not played or aborted / len(played) <= limit:
        return None
    said = most_said(errors)
    return (
        f"checkpoint {checkpoint}: {aborted} of {len(played)} episodes ABORTED, more than "
        f"max_aborted_share = {limit:g} allows. The engine said: {said}"
    )


def resolve(config: ExperimentConfig, spec: str) -> Checkpoint:
    """A --checkpoint (a path, or latest), as the backend's engine reads it."""
    return build_backend(config).eval_engine().resolve(spec)


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
    return load_secrets(config.services.env_file)


@contextmanager
def services(config: ExperimentConfig, logs: Path) -> Iterator[dict[str, list[str]]]:
    """The backend's services on loopback (free ports), with the env file's keys, for the
    duration of the evaluation; the rollout here sends the file's service token."""
    secrets = env_file_values(config)
    secrets = {**secrets, **config.services.proxy_environment({**os.environ, **secrets})}
    with ExitStack() as stack:
        if TOKEN_ENV in secrets and not os.environ.get(TOKEN_ENV):
            os.environ[TOKEN_ENV] = secrets[TOKEN_ENV]  # deepdive.clients reads it
            stack.callback(os.environ.pop, TOKEN_ENV, None)
        urls = {}
        for spec in build_backend(config).services():
            config_file = spec.write_config(logs)
            arguments = [*spec.command_arguments(None, config_file), "--host", "127.0.0.1"]
            process = ServiceProcess(
                spec.name, arguments, logs / f"{spec.name}.log", environment=secrets
            )
            urls[spec.name] = stack.enter_context(process).urls
        yield urls


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

    engine = build_backend(config).eval_engine()
    for checkpoint in checkpoints:  # before anything starts
        engine.check(checkpoint)
    training = engine.rollout()
    params = {
        "max_new_tokens": training.max_response_tokens,
        "temperature": temperature,
        "top_p": 1.0,
    }
    summaries: dict[str, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    refused: list[str] = []  # checkpoints whose episodes SGLang mostly failed
    with services(config, out / "logs") as urls:
        for checkpoint in checkpoints:
            with engine.serve(checkpoint, out / "logs") as (sglang, tokenizer):
                settings = RolloutSettings.of(
                    training.knobs,
                    sglang_url=sglang,
                    tool_server_url=(tuple(urls["tools"]),),  # one node's workers
                    reward_server_url=tuple(urls["reward"]),
                    max_context_tokens=training.max_context_tokens,
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
            aborted = summaries[checkpoint.name]["aborted"]
            console.print(
                f"{checkpoint.name}: accuracy {summaries[checkpoint.name]['accuracy']:.3f} "
                f"over {len(episodes) - aborted} episodes"
                + (f" ({aborted} ABORTED, not counted)" if aborted else "")
            )
            refusal = too_many_aborted(checkpoint.name, played, training.knobs.max_aborted_share)
            if refusal:
                refused.append(refusal)
    atomic_write_bytes(out / "results.jsonl", b"".join(orjson.dumps(r) + b"\n" for r in results))
    atomic_write_bytes(out / "summary.json", orjson.dumps(summaries, option=orjson.OPT_INDENT_2))
    print_table(summaries, samples, console)
    if refused:  # after every checkpoint's results are written: nothing played is lost
        raise RuntimeFailure(f"{' | '.join(refused)}. {EVAL_HINTS}")
    return summaries
