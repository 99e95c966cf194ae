"""A world on disk: its pages, its three disjoint question sets and the demonstrations of the
warm-start questions, each file written whole or not at all."""

from __future__ import annotations

from collections import Counter
from dataclasses import fields
from pathlib import Path

from deepdive.convert.rows import AtomicJsonlWriter
from deepdive.offline.demonstrations import Demonstrator, demonstration_row
from deepdive.offline.world import (
    Question,
    World,
    WorldSizes,
    corpus,
    demonstration_world_seeds,
    generate_questions,
    generate_world,
)
from services.tool_server.corpus import CorpusIndex, Document


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
