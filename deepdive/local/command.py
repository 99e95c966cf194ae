"""`deepdive run` and `deepdive serve engine`: the command-line faces of the CPU backend."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from deepdive.local.engine import DEFAULT_MAX_BATCH
from services.base.cli import add_overrides_argument
from services.base.errors import ConfigError


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    from services.serving.serve import add_connection_options, add_server_arguments

    add_server_arguments(parser, 30000)
    add_connection_options(parser)
    parser.add_argument(
        "--model",
        type=Path,
        required=True,
        help="a local Hugging Face causal-LM folder (model and tokenizer)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help="requests decoded together at most (default: %(default)s)",
    )


def run_engine(args: argparse.Namespace) -> None:
    """`deepdive serve engine`: SGLang's /generate for a local model, on CPU (or one GPU)."""
    from deepdive.local.engine import LocalEngine, create_engine_app
    from deepdive.local.model import load_model
    from services.serving.metrics import ServiceMetrics
    from services.serving.serve import announcer, bind, connection_limits, prepare, serve

    limits = connection_limits(args)  # a bad limit fails before anything loads
    token = prepare(args)
    if not (args.model / "config.json").is_file():
        raise ConfigError(
            f"--model {args.model}: no config.json (expected a Hugging Face model folder)"
        )
    sock = bind(args.host, args.port)
    model, tokenizer = load_model(args.model)
    metrics = ServiceMetrics("engine")
    app = create_engine_app(
        LocalEngine(model, tokenizer, max_batch=args.max_batch),
        metrics=metrics,
        token=token,  # bearer auth on all but /health, as every other service
    )
    examples = [
        "try: curl -s{auth} -X POST {base}/generate -H 'Content-Type: application/json' "
        '-d \'{{"input_ids": [1, 2, 3], "sampling_params": {{"max_new_tokens": 8}}}}\''
    ]
    serve(
        app,
        sock,
        log_level=args.log_level,
        on_listening=announcer(f"local engine ({args.model})", token, examples, args.ready_file),
        limits=limits,
        metrics=metrics,
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        type=Path,
        nargs="?",
        help="a TOML file (configs/local.toml); without one, the embedded defaults",
    )
    add_overrides_argument(parser, "--set grpo.steps=5 --set run.out=runs/b")


def run_local(args: argparse.Namespace) -> None:
    """`deepdive run`: world, services, warm start, GRPO, evaluation, on this machine."""
    from deepdive.local.config import load_local_config
    from deepdive.local.run import LocalRun
    from deepdive.local.summary import print_summary

    config = load_local_config(args.config, args.overrides)
    console = Console(stderr=True)
    summary = LocalRun(config, console).run()
    print_summary(summary, Console())
