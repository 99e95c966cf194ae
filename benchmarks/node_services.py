"""Every node's services in a 2-node slime job: tool server CPU and upstream calls per node.

A real 2-node Slurm job here runs the local backend (slime needs GPUs), whose rollout workers
each call their own node's services; what slime's rollout does with the YAML is measured here
instead, with everything but slime's GPU side real:

- two "nodes" on this host, at 127.0.0.1 and 127.0.0.2, each running what a node of a slime
  job runs: a tool server of WORKERS worker processes (Serper search, the offline reader) and
  a reward server (the OpenAI-compatible judge), and each its own fake paid upstream
  (fakes/upstream.py as Serper and as the judge, 50 ms a call), so every call is counted
  against the node that made it;
- the slime backend writes the YAML from the attempt's 2-node cluster.json, as node 0 does in
  a job; slime's rollout is played as slime plays it (train.py's argv through slime's parsers,
  slurm/backends/slime/replay.py; the YAML's keys set on args; our hooks loaded by path; a group's
  samples at once and every group of a rollout in flight; the reward per sample), against a
  fake SGLang: each episode searches its question (the same in a group), clicks, searches a
  follow-up (one of four, at random), answers;
- measured per node: the tool server's CPU (supervisor and workers, from /proc), its tool
  calls and Serper calls (each worker's /metrics), the reward server's CPU, evaluations and
  judge calls (its /metrics);
- the same rollouts with the YAML as it was before (node 0's URLs only), on fresh services;
  the two in turn, REPEATS times, medians.

What it cannot show: slime's own actors and SGLang's latency (the fake answers at once), a real
network between the nodes, the paid upstreams' real latency and rate limits.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from argparse import Namespace
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from benchmarks.harness import cpu_seconds, free_port, process, python_module
from benchmarks.tool_server import write_corpus
from deepdive.clients import close_clients
from deepdive.protocol import format_tool_call
from deepdive.rollout_settings import TOKENIZER_ARG
from deepdive.sample import LocalSample
from fakes.sglang import ByteTokenizer, FakeSGLang, ScriptedTurn
from services.base.process import ServiceProcess
from services.serving.serve import bind, start_server_thread
from slurm.backends.slime.backend import CUSTOM_CONFIG, SlimeBackend
from slurm.backends.slime.replay import replay
from slurm.cluster_note import ClusterNode, ClusterNote, write_cluster
from slurm.config import ExperimentConfig, load_experiment
from slurm.run_folder import AttemptFolder, RunFolder

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs" / "deepdive-qwen.toml"
ADDRESSES = ("127.0.0.1", "127.0.0.2")
WORKERS = 2  # tool server workers per node (the recipe: one per core, at most 8)
ROLLOUTS = 4  # of the recipe's rollout_batch_size groups x n_samples_per_prompt samples
UPSTREAM_LATENCY_S = 0.05
FOLLOW_UPS = 4  # distinct follow-up searches a group's samples choose among
ANSWER = "Paris"  # what the fake judge grades correct
REPEATS = 3  # each YAML, in turn; medians


def recipe(root: Path) -> ExperimentConfig:
    """The slime recipe over placeholder files (nothing is trained or served from them)."""
    model, reference = root / "model", root / "reference"
    model.mkdir()
    reference.mkdir()
    (model / "config.json").write_text("{}")
    (root / "prompts.jsonl").write_text("{}\n")
    (root / "train.sif").write_bytes(b"sif")
    env = root / "keys.env"
    env.write_text("SERPER_API_KEY=placeholder\n")
    env.chmod(0o600)
    return load_experiment(
        RECIPE,
        [
            f'run.folder="{root / "run"}"',
            f'slime.model.hf_checkpoint="{model}"',
            f'slime.model.ref_load="{reference}"',
            f'slime.rollout.prompt_data="{root / "prompts.jsonl"}"',
            f'container.image="{root / "train.sif"}"',
            f'services.env_file="{env}"',
        ],
    )


@contextmanager
def node_services(work: Path, number: int) -> Iterator[dict[str, Any]]:
    """One node's fake upstream, tool server and reward server, on the node's address."""
    address, port = ADDRESSES[number], free_port()
    upstream = f"http://127.0.0.1:{port}"
    fake = python_module(
        "fakes.upstream", "--port", str(port), "--latency", str(UPSTREAM_LATENCY_S)
    )
    keys = {"SERPER_API_KEY": "a-benchmark-key", "DEEPDIVE_JUDGE_API_KEY": "a-benchmark-key"}
    with ExitStack() as stack:
        stack.enter_context(process(fake, f"{upstream}/stats", work / f"upstream-{number}.log"))
        tool_arguments = [
            "tools", "--workers", str(WORKERS), "--host", address,
            "--search", "serper", "--serper.base-url", upstream, "--serper.max-concurrency", "1024",
            "--reader", "offline", "--corpus", str(work / "corpus.jsonl"),
            "--index-cache-dir", str(work / "idx"), "--log-level", "WARNING",
        ]  # fmt: skip
        reward_arguments = [
            "reward", "--host", address, "--judge", "openai",
            "--judge-upstream.base-url", f"{upstream}/v1", "--log-level", "WARNING",
        ]  # fmt: skip
        tools = ServiceProcess("tools", tool_arguments, work / f"tools-{number}.log", 120, keys)
        reward = ServiceProcess(
            "reward", reward_arguments, work / f"reward-{number}.log", 120, keys
        )
        stack.enter_context(tools)
        stack.enter_context(reward)
        assert tools.process is not None and reward.process is not None
        yield {
            "tools": tools.url,
            "workers": tools.urls,
            "tools_pid": tools.process.pid,
            "reward": reward.url,
            "reward_pid": reward.process.pid,
        }


def tree_cpu_s(pid: int) -> float:
    """CPU time of a process and its children (a tool server's supervisor and workers)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return cpu_seconds(pid) + sum(cpu_seconds(int(child)) for child in children)


def metric(url: str, name: str, label: str = "") -> float:
    """The sum of a counter's samples on a server's /metrics (those with `label`, if given)."""
    total = 0.0
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + "{") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def node_counts(node: dict[str, Any]) -> dict[str, float]:
    return {
        "tool_cpu_s": tree_cpu_s(node["tools_pid"]),
        "tool_calls": sum(metric(w, "deepdive_tool_requests_total") for w in node["workers"]),
        "serper_calls": sum(
            metric(w, "deepdive_tool_upstream_calls_total", 'upstream="serper"')
            for w in node["workers"]
        ),
        "reward_cpu_s": cpu_seconds(node["reward_pid"]),
        "reward_calls": metric(
            node["reward"], "deepdive_reward_requests_total", 'operation="evaluate_batch"'
        ),
        "judge_calls": metric(node["reward"], "deepdive_reward_upstream_calls_total"),
    }


def write_yaml(
    config: ExperimentConfig, attempt: AttemptFolder, nodes: list[dict[str, Any]]
) -> None:
    """cluster.json as node 0's bootstrap writes it (slurm/bootstrap.py, `_join`), then the
    backend's YAML from it, as node 0 writes it before train.py starts."""
    attempt.root.mkdir(parents=True, exist_ok=True)
    entries = tuple(
        ClusterNode(n, f"deepdive_node_{n}", tuple(node["workers"]), node["reward"])
        for n, node in enumerate(nodes)
    )
    write_cluster(attempt.cluster, ClusterNote(attempt.root.name, "", entries))
    SlimeBackend(config).before_training(attempt)


def slime_args(config: ExperimentConfig, attempt: AttemptFolder, sglang: str) -> Namespace:
    """slime's args: train.py's argv as slime's parsers read it, the YAML's keys set on them
    (slime/utils/arguments.py, lines 2013-2019), the router's address; a byte tokenizer."""
    command = SlimeBackend(config).command(attempt)
    args = Namespace(**replay(command[2:]).namespace)
    for key, value in (yaml.safe_load((attempt.root / CUSTOM_CONFIG).read_text()) or {}).items():
        setattr(args, key, value)
    router = urlsplit(sglang)
    args.sglang_router_ip, args.sglang_router_port = router.hostname, router.port
    setattr(args, TOKENIZER_ARG, ByteTokenizer())
    return args


def load_function(path: str) -> Any:
    """slime/utils/misc.py, `load_function`, lines 39-48."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def choose(text: str) -> ScriptedTurn:
    observations = text.count("<observation>")
    question = text.split("\n", 2)[1]
    if observations == 0:
        return ScriptedTurn(format_tool_call("search", {"query": question}))
    if observations == 1:
        return ScriptedTurn(format_tool_call("click", {"link_id": 1}))
    if observations == 2:
        follow_up = f"{question} follow-up {random.randrange(FOLLOW_UPS)}"
        return ScriptedTurn(format_tool_call("search", {"query": follow_up}))
    return ScriptedTurn(format_tool_call("finish", {"answer": ANSWER}))


async def rollout(args: Namespace, number: int) -> int:
    """One rollout as slime's generate_rollout_async keeps it: every group in flight, each
    group's samples at once (slime/rollout/sglang_rollout.py, `generate_and_rm_group`, lines
    297-335, and `generate_and_rm`, lines 225-294, without --group-rm). Episodes played."""
    generate = load_function(args.custom_generate_function_path)
    reward = load_function(args.custom_rm_path)
    params = {"max_new_tokens": args.rollout_max_response_len, "temperature": 1.0}

    async def episode(sample: LocalSample) -> None:
        sample.session_id = str(uuid.uuid4())
        played = await generate(args, sample, dict(params), evaluation=False)
        played.reward = await reward(args, played)

    text = "<|im_start|>user\nRollout {r}, question {g}: who built the orrery?<|im_end|>\n"
    samples = [
        LocalSample(prompt=text.format(r=number, g=g) + "<|im_start|>assistant\n", label=ANSWER)
        for g in range(args.rollout_batch_size)
        for _ in range(args.n_samples_per_prompt)
    ]
    await asyncio.gather(*(episode(sample) for sample in samples))
    return len(samples)


def measure(config: ExperimentConfig, work: Path, every_node: bool) -> dict[str, Any]:
    """ROLLOUTS rollouts on fresh services of two nodes, with every node's URLs in the YAML
    (or node 0's only, as it was); what each node's services did."""
    with ExitStack() as stack:
        nodes = [stack.enter_context(node_services(work, n)) for n in range(len(ADDRESSES))]
        attempt = RunFolder(work / "run").attempt("every" if every_node else "node0")
        write_yaml(config, attempt, nodes if every_node else nodes[:1])
        sglang = stack.enter_context(serve_sglang())
        args = slime_args(config, attempt, sglang)
        before = [node_counts(node) for node in nodes]
        started = time.perf_counter()
        episodes = asyncio.run(played(args))
        elapsed = time.perf_counter() - started
        after = [node_counts(node) for node in nodes]
    per_node = [
        {key: round(after[n][key] - before[n][key], 3) for key in before[n]}
        for n in range(len(nodes))
    ]
    return {
        "yaml": "every node's URLs" if every_node else "node 0's URLs (as before)",
        "episodes": episodes,
        "seconds": round(elapsed, 1),
        "nodes": per_node,
    }


async def played(args: Namespace) -> int:
    try:
        return sum([await rollout(args, number) for number in range(ROLLOUTS)])
    finally:
        await close_clients()


@contextmanager
def serve_sglang() -> Iterator[str]:
    """The fake SGLang in a thread of this process (its CPU is not measured)."""
    sock = bind("127.0.0.1", 0)
    stop = start_server_thread(FakeSGLang([], choose=choose).app(), sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop()


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure of each node: its median over the repeats (the machine may be shared)."""
    first = runs[0]
    nodes = [
        {key: statistics.median(run["nodes"][n][key] for run in runs) for key in node}
        for n, node in enumerate(first["nodes"])
    ]
    seconds = statistics.median(run["seconds"] for run in runs)
    return {
        "yaml": first["yaml"],
        "episodes": first["episodes"],
        "seconds": seconds,
        "nodes": nodes,
    }


def run(repeats: int = REPEATS) -> dict[str, Any]:
    random.seed(0)
    with tempfile.TemporaryDirectory(prefix="deepdive-bench-nodes-") as tmp:
        work = Path(tmp)
        write_corpus(work / "corpus.jsonl")
        config = recipe(work)
        measured: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(repeats):  # the two YAMLs in turn
            for every_node in (False, True):
                measured[every_node].append(measure(config, work, every_node))
    return {
        "workers_per_node": WORKERS,
        "rollouts": ROLLOUTS,
        "groups_per_rollout": config.slime.rollout.rollout_batch_size,
        "samples_per_group": config.slime.rollout.n_samples_per_prompt,
        "upstream_latency_ms": UPSTREAM_LATENCY_S * 1000,
        "repeats": repeats,
        "cpu_cores": os.cpu_count(),
        "runs": [median_run(measured[False]), median_run(measured[True])],
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
