"""`deepdive world`: the command-line face of the offline world."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from deepdive.offline.build import write_world
from deepdive.offline.world import WorldSizes
from services.base.errors import ConfigError


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
