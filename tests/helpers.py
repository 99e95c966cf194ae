"""What several test modules share: the small corpus, real servers on loopback, and builders of
the rollout's services and arguments. Fixtures stay in conftest.py; fakes live in fakes/."""

from __future__ import annotations

import asyncio
import fnmatch
import importlib
import ipaddress
import json
import math
import os
import re
import subprocess
import sys
import time
from argparse import Namespace
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pytest_httpserver import HTTPServer
from starlette.types import ASGIApp, Receive, Scope, Send

from deepdive.local.checkpoint import newest_step
from deepdive.rollout_settings import RolloutSettings, rollout_args
from deepdive.sample import LocalSample
from fakes.sglang import ByteTokenizer
from services.base.secrets import PROXY_ENVS
from services.reward_server.app import create_app as create_reward_app
from services.reward_server.config import RewardServerConfig
from services.reward_server.evaluator import Evaluator
from services.reward_server.rule_judge import RuleJudge
from services.serving.metrics import ServiceMetrics
from services.serving.serve import bind, start_server_thread
from services.tool_server.app import create_app as create_tool_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.tools import ToolExecutor
from slurm.config import ExperimentConfig, load_experiment
from slurm.node.children import NodeChildren
from slurm.node.egress import PROBE_QUERY
from slurm.node.environment import NodeInfo
from slurm.node.phases import PhaseLog
from slurm.node.watch import NodeWatch

DEEPDIVE = [sys.executable, "-m", "slurm.cli"]

FORBIDDEN_QUESTION = (
    "Which reclusive clockmaker from the valley of Vorn built the silver orrery that was "
    "later stolen from the museum in Haldor during the winter festival?"
)

DOCUMENTS = [
    {
        "url": "https://wiki.example/Orrery_of_Haldor",
        "title": "Orrery of Haldor",
        "text": "The silver orrery of Haldor is a mechanical model of the planets. "
        "It was built by the clockmaker Ilse Varen in the valley of Vorn.",
    },
    {
        "url": "https://wiki.example/Ilse_Varen",
        "title": "Ilse Varen",
        "text": "Ilse Varen was a reclusive clockmaker. She was born in Vorn and built orreries.",
    },
    {
        "url": "https://quiz.example/leak",
        "title": "Quiz answers",
        "text": "Q: " + FORBIDDEN_QUESTION + " A: Ilse Varen.",
    },
    {
        "url": "https://wiki.example/Haldor",
        "title": "Haldor",
        "text": "Haldor is a city with a famous museum. " + "The museum has many rooms. " * 120,
    },
    {
        "url": "https://blocked.example/Vorn",
        "title": "Vorn valley",
        "text": "The valley of Vorn is home to clockmakers.",
    },
]


class _Closable(Protocol):
    async def aclose(self) -> None: ...


Closable = TypeVar("Closable", bound=_Closable)


class Closing(Protocol):
    """The `closing` fixture (conftest.py): returns what it is given, closed after the test."""

    def __call__(self, thing: Closable, /) -> Closable: ...


def git_ignored(root: Path, paths: list[str]) -> set[str]:
    """The paths (relative to `root`) that git ignores there, such as containers/build/'s copy
    of the tree that the container tests stage; none where `root` is not in a git work tree or
    there is no git."""
    if not paths:
        return set()
    try:
        found = subprocess.run(
            ["git", "-C", str(root), "check-ignore", "--stdin"],
            input="\n".join(paths),
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:  # no git (the image's test run, the checkout mounted at /src)
        return {path for path in paths if _ignored_by_gitignore(root, path)}
    return set(found.stdout.splitlines()) if found.returncode in (0, 1) else set()


def _ignored_by_gitignore(root: Path, path: str) -> bool:
    """Whether `root`/.gitignore's lines ignore `path` (no git to ask): an anchored line
    (`containers/build/`) by prefix, any other by name of a folder on the path (`build/`,
    `*.egg-info/`), or of the file too for a line that does not end in "/"."""
    ignore = root / ".gitignore"
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.is_file() else []
    parts = path.split("/")
    for line in (line.strip() for line in lines):
        if not line or line.startswith(("#", "!")):
            continue
        folder_only = line.endswith("/")
        pattern = line.strip("/")
        if "/" in pattern:
            if path == pattern or path.startswith(pattern + "/"):
                return True
            continue
        names = parts[:-1] if folder_only else parts
        if any(fnmatch.fnmatchcase(name, pattern) for name in names):
            return True
    return False


@contextmanager
def serve_in_thread(app: ASGIApp) -> Iterator[str]:
    """Run `app` under a real uvicorn on 127.0.0.1 (a free port); yield its base URL."""
    sock = bind("127.0.0.1", 0)
    stop = start_server_thread(app, sock)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop()


def counting(app: ASGIApp, counts: Counter[str]) -> ASGIApp:
    """`app`, counting each HTTP request it is sent as "METHOD /path" (on the server side)."""

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            counts[f"{scope['method']} {scope['path']}"] += 1
        await app(scope, receive, send)

    return counted


def wait_for_requests(server: HTTPServer, count: int, timeout_s: float = 5.0) -> None:
    """Block until a fake upstream has logged `count` requests: a slow handler that outlives
    its test would otherwise land in the next test's log."""
    deadline = time.monotonic() + timeout_s
    while len(server.log) < count and time.monotonic() < deadline:
        time.sleep(0.02)


def worker_pids(supervisor: int) -> list[int]:
    """The child processes of a server's supervisor (services.serving.workers): its workers."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text()
    return [int(pid) for pid in children.split()]


PROMPT = f"<|im_start|>user\n{FORBIDDEN_QUESTION}<|im_end|>\n<|im_start|>assistant\n"
TOKENIZER = ByteTokenizer()


def tool_app(corpus_file: Path, tmp_path: Path, token: str | None = None) -> Any:
    config = ToolServerConfig(corpus=corpus_file, index_cache_dir=tmp_path / "idx", page_chars=400)
    metrics = ServiceMetrics("tool")
    search, reader = build_providers(config, metrics)
    return create_tool_app(ToolExecutor(config, search, reader, metrics), metrics, token)


def reward_app() -> Any:
    return create_reward_app(
        RewardServerConfig(), Evaluator(RuleJudge(), 10), ServiceMetrics("reward")
    )


def make_args(sglang: str, services: dict[str, Any], **extra: Any) -> Namespace:
    """The hook's args against `services`: "tools" one URL, or one server's workers' URLs (a
    list); "reward" one URL."""
    tools = services["tools"]
    settings = RolloutSettings(
        sglang_url=sglang,
        tool_server_url=((tools,),) if isinstance(tools, str) else (tuple(tools),),
        reward_server_url=(services["reward"],),
        retries=0,
        max_context_tokens=extra.pop("context", 100_000),
        **extra,
    )
    return rollout_args(settings, TOKENIZER)


def new_sample() -> LocalSample:
    return LocalSample(
        prompt=PROMPT,
        label="Ilse Varen",
        metadata={
            "remote_env_info": {"forbidden_texts": [FORBIDDEN_QUESTION]},
            "aliases": ["I. Varen"],
        },
    )


# -- Slurm jobs (tests/slurm): a tiny local-backend experiment and ways to watch it ----------

LOCAL_SLURM = Path(__file__).resolve().parent.parent / "scripts" / "local-slurm.sh"

# Two nodes, a tiny world and policy, a few GRPO steps: a job that trains in seconds.
TINY_JOB = Path(__file__).resolve().parent.parent / "configs" / "cluster-tiny.toml"


def tiny_job(folder: Path, steps: int = 4, *sets: str) -> list[str]:
    """`deepdive submit` arguments for the tiny 2-node job, training into `folder`."""
    overrides = [f'run.folder="{folder}"', f"local.grpo.steps={steps}", *sets]
    return [str(TINY_JOB), *(item for value in overrides for item in ("--set", value))]


def node_watch(run: Path, node: NodeInfo, clock: Callable[[], float]) -> NodeWatch:
    """A node's watch as its bootstrap builds it, over the run folder `run` with the tiny
    job's timeouts, before the node has started any child."""
    config = load_experiment(TINY_JOB, [f'run.folder="{run}"'])
    attempt = config.run_folder.attempt(node.attempt)
    return NodeWatch(
        node,
        attempt,
        PhaseLog(attempt.phases(node.node), node.node, node.attempt),
        NodeChildren(),
        join_timeout_s=config.bootstrap.join_timeout_s,
        stop_timeout_s=config.bootstrap.stop_timeout_s,
        clock=clock,
    )


class FakeClock:
    """A `services.base.clock.Clock` a test moves by hand (`clock.now += 5`): waits, backoffs,
    deadlines and time-to-live decisions tested without waiting. A sleep on it is recorded in
    `sleeps` and moves the time on at once (an async one also lets the other tasks run)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def submitted_job_id(output: str) -> str:
    found = re.search(r"submitted job (\d+)", output)
    assert found, output
    return found.group(1)


def newest_checkpoint(folder: Path) -> int:
    """The step of the newest complete checkpoint in `folder` (0: none yet). Older ones are
    deleted as new ones land, so wait for this to reach a step, never for a step's folder."""
    return newest_step(folder) or 0


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s} s"
        time.sleep(delay)
        delay = min(0.5, delay * 1.5)


def job_fields(job_id: str, env: dict[str, str]) -> dict[str, str]:
    """`scontrol show job` as key=value pairs (Slurm keeps a job there a while after it ends)."""
    result = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True
    )
    return dict(item.split("=", 1) for item in result.stdout.split() if "=" in item)


def job_left_queue(job_id: str, env: dict[str, str]) -> bool:
    result = subprocess.run(
        ["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True, text=True
    )
    return not result.stdout.strip()


def processes_of_job(job_id: str) -> list[str]:
    """Command lines of every live process started by the job (its environment says so)."""
    found = []
    marker = f"SLURM_JOB_ID={job_id}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in environ and state != "Z":
            found.append(f"{entry.name}: {command}")
    return found


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (its children, theirs, ...), read from /proc."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        try:
            threads = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:  # it ended meanwhile
            continue
        for thread in threads:
            try:
                children = [int(child) for child in (thread / "children").read_text().split()]
            except OSError:
                continue
            found += children
            pending += children
    return found


TCP_LISTEN = "0A"  # a socket's state in /proc/net/tcp (include/net/tcp_states.h)


def _proc_address(field: str) -> tuple[str, int]:
    """/proc/net/tcp's "0100007F:1F90" (each 32-bit word of the address in host order,
    little-endian here) as ("127.0.0.1", 8080)."""
    hexaddress, hexport = field.split(":")
    raw = bytes.fromhex(hexaddress)
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(packed)), int(hexport, 16)


def listening_sockets(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses process `pid` listens on (IPv4 and IPv6), read from its own network
    namespace's tables and its file descriptors: what it bound, not what it announced."""
    inodes = set()
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
        tables = [Path(f"/proc/{pid}/net/{name}").read_text() for name in ("tcp", "tcp6")]
    except OSError:  # it ended meanwhile
        return []
    for descriptor in descriptors:
        try:
            target = os.readlink(descriptor)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in tables:
        for line in table.splitlines()[1:]:
            fields = line.split()
            if fields[3] == TCP_LISTEN and fields[9] in inodes:
                found.append(_proc_address(fields[1]))
    return found


def on_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4 loopback address written as IPv6 (::ffff:127.0.0.1)."""
    parsed = ipaddress.ip_address(address)
    mapped = parsed.ipv4_mapped if isinstance(parsed, ipaddress.IPv6Address) else None
    return parsed.is_loopback or (mapped is not None and mapped.is_loopback)


# -- Serper and Jina as fakes on loopback (pytest-httpserver): what the egress probe reaches ---

SERPER_KEY = "serper-key-never-shown-0123"
RESULT_URL = "https://site.example/orrery"
SERPER_BODY = {
    "searchParameters": {"q": PROBE_QUERY},
    "organic": [{"title": "Orrery", "link": RESULT_URL, "snippet": "A model"}],
}
JINA_BODY = {"code": 200, "data": {"title": "Orrery", "url": RESULT_URL, "content": "A model."}}
ONE_TRY = {"max_attempts": 1}


def internet_tools(serper_url: str, jina_url: str) -> dict[str, Any]:
    """`[services.tools]` searching with Serper and reading with Jina at these addresses, one
    try each (a refusal is reported at once, not after the default retries)."""
    return {
        "search": "serper",
        "reader": "jina",
        "serper": {"base_url": serper_url, "retry": ONE_TRY, "connect_timeout_s": 5},
        "jina": {"base_url": jina_url, "retry": ONE_TRY, "connect_timeout_s": 5},
    }


def answer_search_and_read(server: HTTPServer) -> None:
    """`server` as Serper (one result) and as Jina (that result's page)."""
    server.expect_request("/search", method="POST").respond_with_json(SERPER_BODY)
    server.expect_request(f"/{RESULT_URL}").respond_with_data(
        json.dumps(JINA_BODY), content_type="application/json"
    )


def clean_environment(proxy: str = "") -> dict[str, str]:
    """The tool server's environment: the key, and the test's proxy in every spelling, this
    host's own settings overridden (an empty lower-case one unsets an upper-case one)."""
    spellings = {**dict.fromkeys(PROXY_ENVS, proxy), "NO_PROXY": "", "no_proxy": ""}
    return {**spellings, "SERPER_API_KEY": SERPER_KEY}


# -- the slime recipe over placeholder files (configs/deepdive-qwen.toml needs a model folder,
# its torch_dist, prompts, an image and an env file to load and pass its checks) --------------

SLIME_RECIPE = Path(__file__).resolve().parent.parent / "configs" / "deepdive-qwen.toml"
QWEN25_32B = {  # what Qwen2.5-32B-Instruct's config.json says, the keys the checks read
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_attention_heads": 40,
    "num_hidden_layers": 64,
    "num_key_value_heads": 8,
    "rope_theta": 1000000.0,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,  # the context it serves (no rope_scaling)
    "tie_word_embeddings": False,
}


def slime_world(root: Path) -> dict[str, Path]:
    """The files the recipe names, made under `root`."""
    import json

    model = root / "models" / "Qwen2.5-32B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(QWEN25_32B))
    reference = root / "models" / "Qwen2.5-32B-Instruct_torch_dist"
    reference.mkdir()
    prompts = root / "data" / "train.jsonl"
    prompts.parent.mkdir()
    prompts.write_text('{"input_messages": []}\n')
    image = root / "train.sif"
    image.write_bytes(b"sif")
    env = root / "keys.env"
    env.write_text("SERPER_API_KEY=x\nDEEPDIVE_SERVICE_TOKEN=token-of-the-test-world\n")
    env.chmod(0o600)
    return {
        "model": model,
        "ref": reference,
        "prompts": prompts,
        "image": image,
        "env": env,
        "root": root,
    }


def slime_overrides(world: dict[str, Path], *extra: str) -> list[str]:
    return [
        f'run.folder="{world["root"] / "run"}"',
        f'slime.model.hf_checkpoint="{world["model"]}"',
        f'slime.model.ref_load="{world["ref"]}"',
        f'slime.rollout.prompt_data="{world["prompts"]}"',
        f'container.image="{world["image"]}"',
        f'services.env_file="{world["env"]}"',
        *extra,
    ]


def slime_dry_run(
    world: dict[str, Path], *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`deepdive submit SLIME_RECIPE --dry-run` with slime_overrides(world, *extra), from the
    world's root."""
    arguments = [item for value in slime_overrides(world, *extra) for item in ("--set", value)]
    return subprocess.run(
        [*DEEPDIVE, "submit", str(SLIME_RECIPE), "--dry-run", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=world["root"],
        env=env,
    )


def slime_recipe(world: dict[str, Path], *extra: str) -> ExperimentConfig:
    """The recipe loaded over `world`, with `extra` overrides."""
    return load_experiment(SLIME_RECIPE, slime_overrides(world, *extra))


# -- slime's rollout log path, for the rollout log functions it loads by path --


def load_function(path: str) -> Any:
    """slime/utils/misc.py, `load_function`, lines 39-48."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def slime_log_rollout_data(
    rollout_id: int, args: Namespace, samples: list[Any], extra: dict[str, Any] | None
) -> dict[str, Any]:
    """What slime does with a rollout before it trains on it (slime/observability/
    rollout_metrics.py, `log_rollout_data`, lines 256-271): the custom function first, which
    skips the rest by answering True; then the rollout's extra metrics are logged, with
    slime's own. An exception goes up through RolloutManager.generate (slime/ray/rollout.py,
    line 506) to train.py's ray.get (train.py, line 53): the run stops."""
    custom = load_function(args.custom_rollout_log_function_path)
    if custom(rollout_id, args, samples, extra, 12.5):
        return {}
    return {**(extra or {})}


def slime_log_eval_rollout_data(
    rollout_id: int,
    args: Namespace,
    data: dict[str, Any],
    extra: dict[str, Any] | None = None,
    logged: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """slime/observability/rollout_metrics.py, `log_eval_rollout_data`, lines 223-250 (its
    extra metrics are None after slime's own eval rollout, lines 476-486), without the
    per-sample metrics (`compute_metrics_from_samples`) and the logging backend: the custom
    function first, which skips the rest by answering True; then each set's mean reward, its
    truncated share and, with --log-passrate, its pass@k. What it logs is appended to `logged`
    and returned. Our eval log function logs through slime's own function, which it imports
    inside slime; here it is handed this one (`slime_log`), slime not being installable."""
    logged = [] if logged is None else logged

    def slime_log(rollout: int, args: Any, data: Any, extra: Any) -> None:
        slime_log_eval_rollout_data(rollout, args, data, extra, logged)

    if args.custom_eval_rollout_log_function_path is not None:
        custom = load_function(args.custom_eval_rollout_log_function_path)
        if custom(rollout_id, args, data, extra, slime_log=slime_log):
            return logged
    log_dict = extra or {}
    for key in data:
        rewards = data[key]["rewards"]
        log_dict[f"eval/{key}"] = sum(rewards) / len(rewards)
        if "truncated" in data[key]:
            truncated = data[key]["truncated"]
            log_dict[f"eval/{key}-truncated_ratio"] = sum(truncated) / len(truncated)
        if getattr(args, "log_passrate", False):
            rates = slime_pass_rate(rewards, args.n_samples_per_eval_prompt)
            log_dict |= {f"eval/{key}-{name}": value for name, value in rates.items()}
    logged.append(log_dict)
    return logged


def slime_pass_rate(flat_rewards: list[float], group_size: int) -> dict[str, float]:
    """slime/observability/metric_utils.py, `compute_pass_rate` and `_estimate_pass_at_k`,
    lines 14-56."""
    import numpy as np

    if group_size == 1:
        return {}
    num_groups = len(flat_rewards) // group_size
    names = [2**i for i in range(int(math.log2(group_size)) + 1)]
    assert len(flat_rewards) == num_groups * group_size
    groups = np.array(flat_rewards).reshape(num_groups, group_size)

    def estimator(n: int, c: int, k: int) -> float:
        if n - c < k:
            return 1.0
        return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))

    log_dict = {}
    for k in names:
        num_correct = np.sum(groups == 1, axis=1)
        estimates = [estimator(group_size, int(c), k) for c in num_correct]
        log_dict[f"pass@{k}"] = float(np.mean(estimates))
    return log_dict
