"""The offline world: deterministic, answerable only by searching, and consistent with the tool
server, the converter and the reward server that will train on it."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from deepdive.convert.rows import convert
from deepdive.offline.build import write_world
from deepdive.offline.world import (
    WorldSizes,
    corpus,
    demonstration_world_seeds,
    describe,
    generate_questions,
    generate_world,
    name_words,
)
from deepdive.protocol import RewardRequest, find_tool_calls, format_observation
from services.reward_server.evaluator import Evaluator
from services.reward_server.rule_judge import RuleJudge
from services.serving.metrics import ServiceMetrics
from services.tool_server.app import create_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.corpus import read_jsonl_corpus
from services.tool_server.tools import ToolExecutor
from tests.helpers import serve_in_thread

SMALL = WorldSizes(
    people=24,
    cities=8,
    guilds=6,
    artifacts=16,
    train_questions=60,
    eval_questions=20,
    sft_questions=40,
)


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("world")
    write_world(out, seed=7, sizes=SMALL)
    return out


def test_the_same_seed_gives_the_same_world(world_dir: Path, tmp_path: Path) -> None:
    write_world(tmp_path / "again", seed=7, sizes=SMALL)
    write_world(tmp_path / "other", seed=8, sizes=SMALL)
    for name in (
        "corpus.jsonl",
        "qa_sft.jsonl",
        "qa_train.jsonl",
        "qa_eval.jsonl",
        "demonstrations.jsonl",
        "manifest.json",
    ):
        assert (tmp_path / "again" / name).read_bytes() == (world_dir / name).read_bytes(), name
    assert (tmp_path / "other" / "corpus.jsonl").read_bytes() != (
        world_dir / "corpus.jsonl"
    ).read_bytes()


def test_questions_are_answered_by_walking_the_graph(world_dir: Path) -> None:
    world = generate_world(7, SMALL)
    sft, train = rows(world_dir / "qa_sft.jsonl"), rows(world_dir / "qa_train.jsonl")
    held_out = rows(world_dir / "qa_eval.jsonl")
    assert (len(sft), len(train), len(held_out)) == (40, 60, 20)
    # three disjoint sets, as DeepDive's qa_sft / qa_rl: GRPO never samples a question the
    # warm start demonstrated, and neither sees a held-out one
    texts = [{q["question"] for q in split} for split in (sft, train, held_out)]
    assert sum(map(len, texts)) == len(set.union(*texts)) == 120
    assert len({q["id"] for q in sft + train + held_out}) == 120
    assert {q["hops"] for q in sft + train + held_out} == {1, 2, 3}
    for question in sft + train + held_out:
        path = question["path"]
        assert len(path) - 1 <= question["hops"] <= len(path)
        assert (
            question["answer"] not in question["question"]
        )  # the start entity is described, not named
        assert path[0] not in question["question"]
        entities = [world.entities[name] for name in path]
        if len(path) == question["hops"] + 1:
            assert question["answer"] == entities[-1].name
        else:  # the last step reads an attribute (a year)
            assert question["answer"].isdigit()


def test_generation_is_unambiguous() -> None:
    world = generate_world(3, SMALL)
    questions = generate_questions(world, 40, 5)
    assert len(questions) == 40
    for question in questions:
        start = world.entities[question.path[0]]
        described_alike = [e for e in world.of_kind(start.kind) if describe(e) == describe(start)]
        assert described_alike == [start]  # one entity fits the description: one answer


def test_the_corpus_loads_and_the_questions_convert(world_dir: Path, tmp_path: Path) -> None:
    documents = read_jsonl_corpus(world_dir / "corpus.jsonl")
    assert len(documents) == 24 + 8 + 6 + 16
    summary = convert(world_dir / "qa_train.jsonl", tmp_path / "train.jsonl")
    assert (summary.written, sum(summary.skipped.values()), summary.duplicates) == (60, 0, 0)


@pytest.mark.anyio
async def test_every_demonstration_earns_the_strict_reward(world_dir: Path) -> None:
    evaluator = Evaluator(RuleJudge(), deadline_s=5)
    demonstrations = rows(world_dir / "demonstrations.jsonl")
    assert [d["id"] for d in demonstrations] == [q["id"] for q in rows(world_dir / "qa_sft.jsonl")]
    for demo in demonstrations:
        question = demo["messages"][1]["content"]
        request = RewardRequest(demo["response"], (demo["answer"],), question)
        assert (await evaluator.evaluate(request)).reward == 1, demo["id"]
        assert demo["response"] == "".join(s["text"] for s in demo["segments"])


def test_demonstrations_read_every_fact_and_open_no_page_they_do_not_need(
    world_dir: Path,
) -> None:
    questions = {row["id"]: row for row in rows(world_dir / "qa_sft.jsonl")}
    for demo in rows(world_dir / "demonstrations.jsonl"):
        question = questions[demo["id"]]
        observations = [s["text"] for s in demo["segments"] if s["role"] == "observation"]
        # the answer is read off the last page opened, never guessed
        assert question["answer"] in observations[-1], demo["id"]
        # one search and one click per hop: an entity answer is named on the page before its
        # own, which is not opened; a year ("@founded") is read off its entity's page
        searches = demo["response"].count('"name":"search"')
        assert searches == question["hops"], demo["id"]
        assert demo["response"].count('"name":"click"') == searches


def test_demonstration_observations_are_what_the_tool_server_answers(
    world_dir: Path, tmp_path: Path
) -> None:
    config = ToolServerConfig(corpus=world_dir / "corpus.jsonl", index_cache_dir=tmp_path / "idx")
    metrics = ServiceMetrics("tool")
    search, reader = build_providers(config, metrics)
    app = create_app(ToolExecutor(config, search, reader, metrics), metrics)
    with serve_in_thread(app) as base, httpx.Client(base_url=base) as client:
        for demo in rows(world_dir / "demonstrations.jsonl")[:12]:
            segments = demo["segments"]
            for model, observation in zip(segments[0::2], segments[1::2], strict=False):
                call = find_tool_calls(model["text"])[-1].call
                assert call is not None
                arguments = {k: v for k, v in call.arguments.items() if v is not None}
                reply = client.post(
                    "/tool",
                    json={"session_id": demo["id"], "name": call.name, "arguments": arguments},
                )
                assert format_observation(reply.json()["observation"]) == observation["text"]


def test_demonstrations_can_come_from_other_worlds_only(world_dir: Path, tmp_path: Path) -> None:
    """world.sft_worlds: the warm start then never reads a page of the world it is evaluated on,
    so an answer it gets right there was read, not remembered."""
    write_world(tmp_path, seed=7, sizes=dataclasses.replace(SMALL, sft_worlds=3, sft_questions=20))
    seeds = demonstration_world_seeds(7, 3)
    assert 7 not in seeds and len(set(seeds)) == 3
    sft, demos = rows(tmp_path / "qa_sft.jsonl"), rows(tmp_path / "demonstrations.jsonl")
    assert len(sft) == 20 and [d["id"] for d in demos] == [q["id"] for q in sft]
    assert {q["id"].split("-")[0] for q in sft} == {f"w{seed}" for seed in seeds}
    urls = {seed: {d["url"] for d in corpus(generate_world(seed, SMALL))} for seed in seeds}
    for demo in demos:
        shown = set(re.findall(r"https://\S+", demo["response"]))
        seed = int(demo["id"].split("-")[0][1:])
        assert shown and shown <= urls[seed], demo["id"]  # only its own world's pages
        assert demo["answer"] in demo["segments"][-2]["text"]  # read off the last page
    # the RL and held-out questions are this world's, the same wherever the demonstrations are
    for name in ("corpus.jsonl", "qa_train.jsonl", "qa_eval.jsonl"):
        assert rows(tmp_path / name) == rows(world_dir / name), name


def test_no_demonstrated_question_from_another_world_reads_like_an_asked_one(
    tmp_path: Path,
) -> None:
    """Descriptions are attributes, which worlds share: across 20 worlds this small a few of
    this world's question texts come up again, and must not be demonstrated with another
    answer."""
    tiny = WorldSizes(
        people=6,
        cities=3,
        guilds=2,
        artifacts=4,
        train_questions=1000,  # every question this world can ask
        eval_questions=8,
        max_hops=1,
        sft_questions=400,
        sft_worlds=20,
    )
    write_world(tmp_path, seed=2, sizes=tiny)
    asked = rows(tmp_path / "qa_train.jsonl") + rows(tmp_path / "qa_eval.jsonl")
    demonstrated = rows(tmp_path / "qa_sft.jsonl")
    assert demonstrated and asked
    assert not {q["question"] for q in asked} & {q["question"] for q in demonstrated}


def test_the_command(tmp_path: Path) -> None:
    out = tmp_path / "w"
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "slurm.cli",
            "world",
            "--out",
            str(out),
            "--seed",
            "1",
            "--sft",
            "7",
            "--train",
            "10",
            "--eval",
            "5",
            "--max-hops",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    counts = [manifest[k] for k in ("sft", "demonstrations", "train", "eval", "hops")]
    assert counts == [7, 7, 10, 5, {"1": 22}]
    bad = subprocess.run(
        [sys.executable, "-m", "slurm.cli", "world", "--out", str(out), "--people", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--people: expected at least 1" in bad.stderr


def test_a_small_world_fills_the_held_out_split_first() -> None:
    world = generate_world(2, WorldSizes(people=6, cities=3, guilds=2, artifacts=4))
    taken: set[str] = set()
    held_out = generate_questions(world, 10, 1, taken, max_hops=1)
    train = generate_questions(world, 1000, 2, taken, max_hops=1)
    assert len(held_out) == 10 and 0 < len(train) < 1000  # the space ran out on train's side
    assert {q.hops for q in held_out + train} == {1}
    assert not {q.question for q in held_out} & {q.question for q in train}


def test_demonstrations_list_the_names_they_mention(world_dir: Path) -> None:
    """`names` is what the warm start renames: every name word in the text, nothing else."""
    world = generate_world(7, SMALL)
    words = {word for name in world.entities for word in name_words(name)}
    questions = {row["id"]: row for row in rows(world_dir / "qa_sft.jsonl")}
    for demo in rows(world_dir / "demonstrations.jsonl"):
        text = demo["response"]
        mentioned = {w for w in words if re.search(rf"(?<![A-Za-z]){w}(?![A-Za-z])", text)}
        assert demo["names"] == sorted(mentioned), demo["id"]
        answer = questions[demo["id"]]["answer"]
        assert set(name_words(answer)) <= set(demo["names"])  # a year has no name words
