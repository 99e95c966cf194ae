"""Step 4: SGLang as slime drives it, on node 0.

SGLang serves the model with tensor parallelism (--tp-size, --enable-memory-saver as slime's
colocated runs need) and registers with slime's router the way slime's engines do (POST
/workers); then, through the router and the engine's own endpoints:

- generate: a greedy answer through the router (the answer the later checks compare with);
- memory release and resume (/release_memory_occupation after /flush_cache, then
  /resume_memory_occupation): the GPUs' used memory falls and comes back (nvidia-smi), and
  the answer after resuming is the one before;
- a weight update from tensor (/update_weights_from_tensor, a CUDA tensor serialized with
  SGLang's MultiprocessingSerializer, one payload per TP rank, as slime's colocated update
  sends them): zeroing the final norm changes the answer, restoring it from the checkpoint
  brings the first answer back.
"""

from __future__ import annotations

import importlib
import json
import subprocess
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx

from services.base.errors import RuntimeFailure
from services.base.process import serving_group
from slurm.smoke.context import SmokeContext
from slurm.smoke.gpus import NoDriver, nvidia_smi, torch_gpus
from slurm.smoke.report import Check, failed, passed

READY_TIMEOUT_S = 900.0
PROMPT = "The capital of France is"
NEW_TOKENS = 16
PARAMETER = "model.norm.weight"  # replicated on every TP rank: one tensor serves them all
MEMORY_FREED = 0.5  # of what SGLang holds: a release that frees less did not work


class Unavailable(RuntimeFailure):
    """SGLang did not start or refused a request of the smoke step."""


def server_command(python: str, model: str, tp: int, port: int) -> list[str]:
    return [
        python, "-m", "sglang.launch_server",
        "--model-path", model,
        "--tp-size", str(tp),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enable-memory-saver",
        "--mem-fraction-static", "0.5",
        "--log-level", "info",
    ]  # fmt: skip


def router_command(python: str, port: int, metrics_port: int) -> list[str]:
    return [
        python, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--prometheus-port", str(metrics_port),
    ]  # fmt: skip


def serving(
    command: list[str], log: Path, ready: Callable[[], bool], what: str
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    """A server as a child in its own process group until `ready()`; stopped (the group) when
    the block ends."""
    return serving_group(command, log, ready, what, READY_TIMEOUT_S, Unavailable)


def answers(url: str, path: str, method: str = "GET") -> Callable[[], bool]:
    def probe() -> bool:
        try:
            response = httpx.request(method, f"{url}{path}", timeout=5, trust_env=False)
        except httpx.TransportError:
            return False
        return response.status_code == 200

    return probe


def call(client: httpx.Client, method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    response = client.request(method, url, json=body)
    if response.status_code != 200:
        raise Unavailable(f"{method} {url}: HTTP {response.status_code}: {response.text[:300]}")
    return response.json() if response.content else None


def generate(client: httpx.Client, router: str) -> str:
    reply = call(
        client,
        "POST",
        f"{router}/generate",
        {"text": PROMPT, "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0}},
    )
    return str(reply["text"])


def used_mib() -> int:
    """GPU memory in use on the node, all GPUs together (nvidia-smi)."""
    return sum(gpu.memory_used_mib for gpu in nvidia_smi())


def memory_check(baseline: int, loaded: int, released: int, resumed: int) -> Check:
    """SGLang's memory (loaded - baseline) mostly gone after the release, back after resume."""
    held = loaded - baseline
    numbers = (
        f"in use: {baseline} MiB before SGLang, {loaded} loaded, {released} released, "
        f"{resumed} resumed"
    )
    if held <= 0:
        return failed("memory release and resume", f"SGLang holds no GPU memory? ({numbers})")
    if loaded - released < MEMORY_FREED * held:
        return failed("memory release and resume", f"the release freed too little ({numbers})")
    if resumed - released < MEMORY_FREED * held:
        return failed("memory release and resume", f"the resume took too little back ({numbers})")
    return passed("memory release and resume", numbers)


def hf_tensor(model: Path, name: str) -> Any:
    """One tensor of a Hugging Face checkpoint (single file or sharded with an index)."""
    from safetensors import safe_open

    index = model / "model.safetensors.index.json"
    if index.is_file():
        shard = json.loads(index.read_text())["weight_map"][name]
        path = model / shard
    else:
        path = model / "model.safetensors"
    with safe_open(str(path), framework="pt") as weights:
        return weights.get_tensor(name)


def serialized(tensor: Any, tp: int) -> list[str]:
    """The update's payload as slime sends it: SGLang's serializer over (name, CUDA tensor),
    once per TP rank; torch's CUDA reductions patched to name the device by UUID."""
    utils = importlib.import_module("sglang.srt.utils")
    try:
        patch = importlib.import_module("sglang.srt.utils.patch_torch")
    except ImportError:
        patch = importlib.import_module("sglang.srt.patch_torch")
    patch.monkey_patch_torch_reductions()
    payload = utils.MultiprocessingSerializer.serialize([(PARAMETER, tensor)], output_str=True)
    return [payload] * tp


def update(client: httpx.Client, engine: str, tensor: Any, tp: int) -> None:
    body = {"serialized_named_tensors": serialized(tensor, tp), "load_format": None}
    reply = call(
        client, "POST", f"{engine}/update_weights_from_tensor", {**body, "flush_cache": True}
    )
    if not (isinstance(reply, dict) and reply.get("success")):
        raise Unavailable(f"/update_weights_from_tensor answered {reply}")


def run(context: SmokeContext) -> list[Check]:
    gpus, build = torch_gpus()
    tp = context.tp
    if gpus < tp:
        what = "no GPU" if gpus == 0 else f"{gpus} GPU(s)"
        return [failed("SGLang", f"{what}: TP {tp} needs {tp} GPUs on node 0 ({build})")]
    model = Path(context.model) if context.model else None
    if model is None or not (model / "config.json").is_file():
        return [
            failed(
                "SGLang",
                f"no model: --model {context.model or '(not given)'} must be a Hugging Face "
                "folder (Qwen2.5-0.5B-Instruct)",
            )
        ]
    try:
        baseline = used_mib()
    except NoDriver as error:
        return [failed("SGLang", str(error))]
    folder = context.step_folder("4-sglang")
    ports = context.ports()
    engine_port, router_port = ports.ray_gcs, ports.ray_client
    engine, router = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{router_port}"
    checks = []
    with (
        httpx.Client(timeout=300, trust_env=False) as client,
        serving(
            server_command(context.python, str(model), tp, engine_port),
            folder / "sglang.log",
            answers(engine, "/health"),
            f"SGLang (TP {tp})",
        ),
        serving(
            router_command(context.python, router_port, ports.ray_node_manager),
            folder / "router.log",
            answers(router, "/workers"),
            "the router",
        ),
    ):
        call(client, "POST", f"{router}/workers", {"url": engine, "worker_type": "regular"})
        first = generate(client, router)
        checks.append(passed("generate through the router", f"TP {tp}: {PROMPT!r} -> {first!r}"))
        loaded = used_mib()
        call(client, "GET", f"{engine}/flush_cache")
        call(client, "POST", f"{engine}/release_memory_occupation", {})
        released = used_mib()
        call(client, "POST", f"{engine}/resume_memory_occupation", {})
        resumed = used_mib()
        checks.append(memory_check(baseline, loaded, released, resumed))
        after = generate(client, router)
        checks.append(same_answer("answer after resume", first, after))
        checks.append(weight_update(client, engine, router, model, tp, first))
    return checks


def same_answer(name: str, first: str, again: str) -> Check:
    if again != first:
        return failed(name, f"{again!r}, not the first answer {first!r}")
    return passed(name, "the same as before")


def weight_update(
    client: httpx.Client, engine: str, router: str, model: Path, tp: int, first: str
) -> Check:
    import torch

    name = "weight update from tensor"
    original = hf_tensor(model, PARAMETER).to("cuda:0")
    update(client, engine, torch.zeros_like(original), tp)
    zeroed = generate(client, router)
    if zeroed == first:
        return failed(name, f"{PARAMETER} set to zeros, yet the answer did not change ({first!r})")
    update(client, engine, original, tp)
    restored = generate(client, router)
    if restored != first:
        return failed(name, f"{PARAMETER} restored, but the answer is {restored!r}, not {first!r}")
    return passed(
        name,
        f"{PARAMETER} zeroed (answer {zeroed!r}) and restored from the checkpoint (the first "
        f"answer again), {tp} payload(s)",
    )
