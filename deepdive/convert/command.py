"""`deepdive convert`: the command-line face of the data converter."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from deepdive.convert.rows import (
    ConversionError,
    convert,
    default_eval_path,
    slime_flags,
    summary_text,
)
from deepdive.protocol import SYSTEM_PROMPTS
from services.base.errors import ConfigError


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--input",
        type=Path,
        required=True,
        help="QA rows {question, answer, id?, aliases?}: .jsonl, .json or .parquet",
    )
    parser.add_argument(
        "--output", type=Path, required=True, help="slime prompt rows (JSONL), written atomically"
    )
    parser.add_argument(
        "--source",
        default="deepdive",
        help="the source name stored in every row (default: %(default)s)",
    )
    parser.add_argument(
        "--split-eval",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="hold out this fraction for evaluation, split by id (default: 0)",
    )
    parser.add_argument(
        "--eval-output",
        type=Path,
        help="where the held-out rows go (default: OUTPUT with .eval before the suffix)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed of the evaluation split (default: %(default)s)"
    )
    parser.add_argument(
        "--strict", action="store_true", help="stop at the first bad row instead of skipping it"
    )
    parser.add_argument(
        "--system-prompt",
        choices=sorted(SYSTEM_PROMPTS),
        default="full",
        help="the system prompt in every row: full, or compact for tiny local models "
        "(default: %(default)s)",
    )


def _count_lines(path: Path) -> int | None:
    if path.suffix.lower() not in (".jsonl", ".ndjson", ""):
        return None
    with path.open("rb") as handle:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))


def run_convert(args: argparse.Namespace) -> None:
    console = Console(stderr=True)
    if not args.input.is_file():
        raise ConfigError(f"--input {args.input}: no such file")
    progress = Progress(
        TextColumn("converting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not sys.stderr.isatty(),
    )
    eval_output = args.eval_output or default_eval_path(args.output)
    with progress:
        task = progress.add_task("rows", total=_count_lines(args.input))
        try:
            summary = convert(
                args.input,
                args.output,
                source=args.source,
                eval_fraction=args.split_eval,
                eval_output=eval_output,
                strict=args.strict,
                seed=args.seed,
                on_row=lambda: progress.advance(task),
                system_prompt=SYSTEM_PROMPTS[args.system_prompt],
            )
        except ConversionError as error:
            raise ConfigError(str(error)) from None
    console.print(summary_text(summary), highlight=False, soft_wrap=True)
    flags = slime_flags(args.output, eval_output if summary.eval_written else None)
    console.print(
        "slime flags for this data:\n  " + " \\\n  ".join(flags), highlight=False, soft_wrap=True
    )
