"""`deepdive convert`: the command-line face of the data converter."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import fields
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from deepdive.convert import (
    AtomicJsonlWriter,
    ConversionError,
    convert,
    default_eval_path,
    slime_flags,
    summary_text,
)
from deepdive.demonstrations import Demonstrator, demonstration_row
from deepdive.protocol import SYSTEM_PROMPTS
from deepdive.world import (
    Question,
    World,
    WorldSizes,
    corpus,
    demonstration_world_seeds,
    generate_questions,
    generate_world,
)
from services.exceptions import ConfigError
from services.tool_server.corpus import CorpusIndex, Document


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


def add_world_arguments(parser: argparse.ArgumentParser) -> None:
    sizes = WorldSizes()
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for corpus, questions and demonstrations"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the same seed gives the same world (default: %(default)s)",
    )
    for name in ("people", "cities", "guilds", "artifacts"):
        parser.add_argument(
            f"--{name}",
            type=int,
            default=getattr(sizes, name),
            help=f"how many {name} (default: %(default)s)",
        )
    parser.add_argument(
        "--sft",
        type=int,
        default=sizes.sft_questions,
        help="questions with a demonstration, for the warm start (default: %(default)s)",
    )
    parser.add_argument(
        "--train",
        type=int,
        default=sizes.train_questions,
        help="RL training questions, disjoint from --sft (default: %(default)s)",
    )
    parser.add_argument(
        "--eval",
        type=int,
        default=sizes.eval_questions,
        help="held-out questions (default: %(default)s)",
    )
    parser.add_argument(
        "--sft-worlds",
        type=int,
        default=sizes.sft_worlds,
        help="draw the --sft questions from this many other worlds, none from this one: "
        "the warm start then cannot recall this world's facts (default: %(default)s)",
    )
    parser.add_argument(
        "--max-hops",
        type=int,
        default=sizes.max_hops,
        choices=(1, 2, 3),
        help="questions walk 1 to this many relations (default: %(default)s)",
    )


def run_world(args: argparse.Namespace) -> None:
    console = Console(stderr=True)
    for name in ("people", "cities", "guilds", "artifacts", "sft", "train", "eval"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name}: expected at least 1, got {getattr(args, name)}")
    if args.sft_worlds < 0:
        raise ConfigError(f"--sft-worlds: expected 0 (this world) or more, got {args.sft_worlds}")
    sizes = WorldSizes(
        people=args.people,
        cities=args.cities,
        guilds=args.guilds,
        artifacts=args.artifacts,
        train_questions=args.train,
        eval_questions=args.eval,
        max_hops=args.max_hops,
        sft_questions=args.sft,
        sft_worlds=args.sft_worlds,
    )
    manifest = write_world(args.out, args.seed, sizes)
    console.print(
        f"world seed {args.seed}: {manifest['documents']} documents, {manifest['sft']} warm-start, "
        f"{manifest['train']} train and {manifest['eval']} eval questions "
        f"(hops {manifest['hops']}), {manifest['demonstrations']} demonstrations in {args.out}",
        highlight=False,
        soft_wrap=True,
    )


def demonstrate(
    world: World, documents: list[dict[str, str]], questions: list[Question]
) -> list[dict[str, object]]:
    """A demonstration row per question that search can walk (the others are skipped)."""
    if not questions:
        return []
    index = CorpusIndex.open([Document(**d) for d in documents], None, show_progress=False)
    demonstrator = Demonstrator(world, index)
    rows = []
    for question in questions:
        segments = demonstrator.demonstrate(question)
        if segments is not None:
            rows.append(demonstration_row(question, segments, demonstrator.names_in(segments)))
    return rows


def write_world(out: Path, seed: int, sizes: WorldSizes) -> dict[str, object]:
    """Write corpus.jsonl, qa_sft.jsonl, qa_train.jsonl, qa_eval.jsonl, demonstrations.jsonl
    (one per qa_sft question) and manifest.json. The three question sets are disjoint."""
    world = generate_world(seed, sizes)
    documents = corpus(world)
    taken: set[str] = set()
    # held-out questions first, then the RL prompts: in a small world the question space runs
    # out, and the evaluation must never be the split that comes up short
    held_out = generate_questions(
        world, sizes.eval_questions, seed * 1_000 + 2, taken, sizes.max_hops
    )
    train = generate_questions(
        world, sizes.train_questions, seed * 1_000 + 1, taken, sizes.max_hops
    )
    # the demonstrated questions come from this world, or from sft_worlds others; `taken`
    # spans them all: no demonstrated question reads like an RL or held-out one (descriptions
    # are attributes, which worlds can share)
    sources = demonstration_world_seeds(seed, sizes.sft_worlds) or [seed]
    sft: list[Question] = []
    demonstrations: list[dict[str, object]] = []
    for k, source_seed in enumerate(sources):
        source = world if source_seed == seed else generate_world(source_seed, sizes)
        share = sizes.sft_questions // len(sources) + (k < sizes.sft_questions % len(sources))
        questions = generate_questions(
            source, share, source_seed * 1_000 + 3, taken, sizes.max_hops
        )
        sft += questions
        pages = documents if source is world else corpus(source)
        demonstrations += demonstrate(source, pages, questions)
    hops = Counter(question.hops for question in [*sft, *train, *held_out])
    manifest: dict[str, object] = {
        "seed": seed,
        "sizes": {item.name: getattr(sizes, item.name) for item in fields(WorldSizes)},
        "documents": len(documents),
        "sft": len(sft),
        "train": len(train),
        "eval": len(held_out),
        "demonstrations": len(demonstrations),
        "hops": {str(k): v for k, v in sorted(hops.items())},
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (
        ("corpus.jsonl", documents),
        ("qa_sft.jsonl", [q.as_row() for q in sft]),
        ("qa_train.jsonl", [q.as_row() for q in train]),
        ("qa_eval.jsonl", [q.as_row() for q in held_out]),
        ("demonstrations.jsonl", demonstrations),
        ("manifest.json", [manifest]),
    ):
        with AtomicJsonlWriter(out / name) as writer:
            for row in rows:
                writer.write(row)
    return manifest


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    from services.serve import add_server_arguments

    add_server_arguments(parser, 30000)
    parser.add_argument(
        "--model",
        type=Path,
        required=True,
        help="a local Hugging Face causal-LM folder (model and tokenizer)",
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=32,
        help="requests decoded together at most (default: %(default)s)",
    )


def run_engine(args: argparse.Namespace) -> None:
    """`deepdive serve engine`: SGLang's /generate for a local model, on CPU (or one GPU)."""
    from deepdive.engine import LocalEngine, create_engine_app
    from deepdive.local_model import load_model
    from services.metrics import ServiceMetrics
    from services.serve import announcer, bind, connection_limits, prepare, serve

    token = prepare(args)
    if not (args.model / "config.json").is_file():
        raise ConfigError(
            f"--model {args.model}: no config.json (expected a Hugging Face model folder)"
        )
    sock = bind(args.host, args.port)
    model, tokenizer = load_model(args.model)
    app = create_engine_app(
        LocalEngine(model, tokenizer, max_batch=args.max_batch),
        metrics=ServiceMetrics("engine"),
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
        on_listening=announcer(f"local engine ({args.model})", token, examples),
        limits=connection_limits(args),
    )


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config",
        type=Path,
        nargs="?",
        help="a TOML file (configs/local.toml); without one, the embedded defaults",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="TABLE.KEY=VALUE",
        help="override one value, e.g. --set grpo.steps=5 --set run.out=runs/b (repeatable)",
    )


def run_local(args: argparse.Namespace) -> None:
    """`deepdive run`: world, services, warm start, GRPO, evaluation, on this machine."""
    from deepdive.local_config import load_local_config
    from deepdive.local_run import LocalRun, print_summary

    config = load_local_config(args.config, args.overrides)
    console = Console(stderr=True)
    summary = LocalRun(config, console).run()
    print_summary(summary, Console())
