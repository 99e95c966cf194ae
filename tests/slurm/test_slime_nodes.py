"""slime's rollout over every node's services: the YAML node 0 writes from a 2-node cluster
note, put on slime's args as slime does, and slime's way of playing a rollout (our hooks loaded
by path, a group's samples at once, the reward per sample) against two "nodes" of real services
on loopback: each node a tool server of two worker processes (on its own address, 127.0.0.1 and
127.0.0.2), its own fake Serper counting upstream calls, and a reward server. Each GRPO group's
calls all reach one worker of one node (its identical first searches cost that node one
upstream call, its rewards come from that node's reward server) while the groups spread over
both nodes. SGLang is the fake (fakes/sglang.py), the tokenizer its byte tokenizer."""

from __future__ import annotations

import asyncio
import importlib
import uuid
from argparse import Namespace
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import yaml

from deepdive.clients import close_clients
from deepdive.protocol import format_tool_call
from deepdive.rollout_settings import TOKENIZER_ARG
from deepdive.sample import LocalSample, SampleStatus
from fakes.sglang import FakeSGLang, ScriptedTurn
from fakes.upstream import create_app as create_upstream_app
from services.base.process import ServiceProcess
from slurm.backends.slime.backend import CUSTOM_CONFIG, SlimeBackend
from slurm.backends.slime.replay import replay
from slurm.cluster_note import ClusterNode, ClusterNote, write_cluster
from slurm.run_folder import RunFolder
from tests.helpers import DOCUMENTS, TOKENIZER, counting, reward_app, serve_in_thread
from tests.helpers import slime_recipe as recipe

pytestmark = pytest.mark.slow

ANSWER = "Ilse Varen"
ADDRESSES = ("127.0.0.1", "127.0.0.2")  # two nodes' addresses (all of 127/8 is loopback)
SEARCH_LATENCY_S = 0.05  # a group's identical searches overlap: one upstream call


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[dict[str, Any]]]:
    """Per node: its fake Serper, its tool server (two workers) and its reward server."""
    folder = tmp_path_factory.mktemp("nodes")
    corpus = folder / "corpus.jsonl"
    corpus.write_bytes(b"\n".join(orjson.dumps(doc) for doc in DOCUMENTS) + b"\n")
    with ExitStack() as stack:
        found = []
        for number, address in enumerate(ADDRESSES):
            upstream = stack.enter_context(serve_in_thread(create_upstream_app(SEARCH_LATENCY_S)))
            rewards: Counter[str] = Counter()
            reward = stack.enter_context(serve_in_thread(counting(reward_app(), rewards)))
            arguments = [
                "tools", "--workers", "2", "--host", address,
                "--search", "serper", "--serper.base-url", upstream,
                "--reader", "offline", "--corpus", str(corpus),
                "--index-cache-dir", str(folder / "idx"), "--log-level", "WARNING",
            ]  # fmt: skip
            tools = ServiceProcess(
                "tools",
                arguments,
                folder / f"tools-{number}.log",
                60,
                {"SERPER_API_KEY": "a-test-key-not-a-secret"},
            )
            stack.enter_context(tools)
            assert all(urlsplit(url).hostname == address for url in tools.urls)
            found.append(
                {
                    "upstream": upstream,
                    "tools": tools.url,
                    "workers": tools.urls,
                    "reward": reward,
                    "reward_calls": rewards,
                }
            )
        yield found


def write_cluster_note(path: Path, nodes: list[dict[str, Any]]) -> None:
    """cluster.json as node 0's bootstrap writes it once every node is ready
    (slurm/bootstrap.py, `_join`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = tuple(
        ClusterNode(n, f"deepdive_node_{n}", tuple(node["workers"]), node["reward"])
        for n, node in enumerate(nodes)
    )
    write_cluster(path, ClusterNote("7-0", "x:6379", entries))


def slime_args(world: dict[str, Path], nodes: list[dict[str, Any]], sglang: str) -> Namespace:
    """slime's args for the rollout of a 2-node job: train.py's argv as slime parses it (its
    parsers replayed, slurm/backends/slime/replay.py), then every key of the YAML node 0 wrote set on
    them (slime/utils/arguments.py, lines 2013-2019), then the router's address slime fills in
    once its router is up; the byte tokenizer stands in for hf_checkpoint's."""
    backend = SlimeBackend(recipe(world))
    attempt = RunFolder(world["root"] / "run").attempt("7-0")
    write_cluster_note(attempt.cluster, nodes)
    backend.before_training(attempt)
    command = backend.command(attempt)
    args = Namespace(**replay(command[3:]).namespace)  # [python, -m, the driver, *argv]
    for key, value in (yaml.safe_load((attempt.root / CUSTOM_CONFIG).read_text()) or {}).items():
        setattr(args, key, value)
    router = urlsplit(sglang)
    args.sglang_router_ip, args.sglang_router_port = router.hostname, router.port
    setattr(args, TOKENIZER_ARG, TOKENIZER)
    return args


def load_function(path: str) -> Any:
    """slime/utils/misc.py, `load_function`, lines 39-48."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


async def slime_group(args: Namespace, group: list[LocalSample]) -> list[LocalSample]:
    """One GRPO group as slime plays it (slime/rollout/sglang_rollout.py at 624b824):
    `generate_and_rm_group` (lines 297-335) gives each sample a session id and runs
    `generate_and_rm` (lines 225-294) for every sample at once: the custom generate function
    (lines 251-260), then, without --group-rm, `async_rm` per sample, which calls the custom
    rm (slime/rollout/rm_hub/__init__.py, lines 55-62)."""
    assert not args.group_rm and not args.partial_rollout
    generate = load_function(args.custom_generate_function_path)
    reward = load_function(args.custom_rm_path)
    params = {"max_new_tokens": args.rollout_max_response_len, "temperature": 1.0}
    for sample in group:
        sample.session_id = sample.session_id or str(uuid.uuid4())

    async def generate_and_rm(sample: LocalSample) -> LocalSample:
        sample = await generate(args, sample, dict(params), evaluation=False)
        if sample.status is not SampleStatus.ABORTED and sample.reward is None:
            sample.reward = await reward(args, sample)
        return sample

    return list(await asyncio.gather(*(generate_and_rm(sample) for sample in group)))


def choose(text: str) -> ScriptedTurn:
    """Every episode: search its prompt's question, click result 1, answer."""
    observations = text.count("<observation>")
    if observations == 0:
        question = text.split("\n", 2)[1]
        return ScriptedTurn(format_tool_call("search", {"query": f"first search: {question}"}))
    if observations == 1:
        return ScriptedTurn(format_tool_call("click", {"link_id": 1}))
    return ScriptedTurn(format_tool_call("finish", {"answer": ANSWER}))


def prompt(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def group_of(question: str, size: int) -> list[LocalSample]:
    return [LocalSample(prompt=prompt(question), label=ANSWER) for _ in range(size)]


def tool_calls(url: str) -> float:
    """Tool calls one worker has answered (its own /metrics: workers share no counters)."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith("deepdive_tool_requests_total{")
    )


def counts(nodes: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Every worker's tool calls, each node's upstream calls and reward calls, now."""
    return {
        "workers": [tool_calls(url) for node in nodes for url in node["workers"]],
        "upstream": [httpx.get(f"{node['upstream']}/stats").json()["calls"] for node in nodes],
        "rewards": [
            node["reward_calls"]["POST /evaluate"] + node["reward_calls"]["POST /evaluate/batch"]
            for node in nodes
        ],
    }


def grown(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, list[float]]:
    return {key: [b - a for a, b in zip(before[key], after[key], strict=True)] for key in before}


async def play(args: Namespace, groups: list[list[LocalSample]]) -> list[LocalSample]:
    try:
        played = await asyncio.gather(*(slime_group(args, group) for group in groups))
    finally:
        await close_clients()  # the pooled clients belong to this event loop
    return [sample for group in played for sample in group]


def test_each_group_keeps_to_one_worker_of_one_node_and_groups_use_both_nodes(
    world: dict[str, Path], nodes: list[dict[str, Any]]
) -> None:
    with serve_in_thread(FakeSGLang([], choose=choose).app()) as sglang:
        args = slime_args(world, nodes, sglang)
        size = args.n_samples_per_prompt  # slime asserts a group has this many samples
        used_workers = set()
        for number in range(args.rollout_batch_size):  # one rollout's groups, one at a time
            before = counts(nodes)
            samples = asyncio.run(play(args, [group_of(f"Who built orrery {number}?", size)]))
            assert all(s.status is SampleStatus.COMPLETED and s.reward == 1.0 for s in samples)
            assert all("no search results to click" not in s.response for s in samples)
            change = grown(before, counts(nodes))
            worker = next(w for w, calls in enumerate(change["workers"]) if calls)
            node = worker // 2
            # search, click, close_session of every sample: all on one worker
            assert change["workers"] == [size * 3 if w == worker else 0 for w in range(4)]
            # the group's identical first searches: one call of its node's Serper
            assert change["upstream"] == [1 if n == node else 0 for n in range(2)]
            assert change["rewards"] == [size if n == node else 0 for n in range(2)]
            used_workers.add(worker)
    assert {worker // 2 for worker in used_workers} == {0, 1}, used_workers


def test_a_whole_rollout_at_once_spreads_over_both_nodes_and_pays_each_search_once(
    world: dict[str, Path], nodes: list[dict[str, Any]]
) -> None:
    """Every group in flight together, as slime's rollout keeps them: each node's upstream
    calls are one per group it served, and its tool calls three per sample of those groups."""
    with serve_in_thread(FakeSGLang([], choose=choose).app()) as sglang:
        args = slime_args(world, nodes, sglang)
        size, groups = args.n_samples_per_prompt, args.rollout_batch_size
        before = counts(nodes)
        batch = [group_of(f"Who restored clock {n}?", size) for n in range(groups)]
        samples = asyncio.run(play(args, batch))
    assert all(s.status is SampleStatus.COMPLETED and s.reward == 1.0 for s in samples)
    change = grown(before, counts(nodes))
    per_node = [sum(change["workers"][2 * n : 2 * n + 2]) for n in range(2)]
    assert sum(change["upstream"]) == groups  # one upstream call per group, none twice
    assert all(calls > 0 for calls in change["upstream"]), change  # both nodes served groups
    assert per_node == [calls * size * 3 for calls in change["upstream"]], change
    assert change["rewards"] == [calls * size for calls in change["upstream"]], change


def test_a_batch_of_rewards_goes_to_each_prompts_node_one_call_per_node(
    world: dict[str, Path], nodes: list[dict[str, Any]]
) -> None:
    """The reward hook given several samples (slime's `batched_async_rm`, with --group-rm or a
    generate function that returns a list) asks each node's reward server for its prompts'
    samples in one batch; each sample's reward is its own."""
    args = slime_args(world, nodes, "http://127.0.0.1:9")
    reward = load_function(args.custom_rm_path)
    finish = format_tool_call("finish", {"answer": ANSWER})
    samples = [
        LocalSample(
            prompt=prompt(f"Which guild kept bell {n}?"),
            label=ANSWER,
            response=finish if n % 3 else format_tool_call("finish", {"answer": "Nobody"}),
            status=SampleStatus.COMPLETED,
        )
        for n in range(12)
    ]
    before = [Counter(node["reward_calls"]) for node in nodes]

    async def score() -> Any:
        try:
            return await reward(args, samples)
        finally:
            await close_clients()

    rewards = asyncio.run(score())
    assert rewards == [1.0 if n % 3 else 0.0 for n in range(12)]
    calls = [node["reward_calls"] - was for node, was in zip(nodes, before, strict=True)]
    assert [c["POST /evaluate/batch"] for c in calls] == [1, 1], calls  # prompts of both nodes
    assert not any(c["POST /evaluate"] for c in calls)
