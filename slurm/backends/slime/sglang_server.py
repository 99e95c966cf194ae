"""SGLang serving a Hugging Face checkpoint for `deepdive eval` on a GPU node: `python -m
sglang.launch_server` as a child on a free loopback port, ready when /health answers 200;
stopped (and its process group with it) when the block ends. Needs SGLang and a GPU: the
training image."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from services.base.errors import RuntimeFailure
from services.base.process import serving_group

READY_TIMEOUT_S = 1800.0  # a large model takes minutes to load


class SGLangStartError(RuntimeFailure):
    code = "sglang_start_failed"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def server_command(model: Path, port: int, context_length: int, tensor_parallel: int) -> list[str]:
    """SGLang's launch command: the context training used (0 = the model's, derived by SGLang
    from config.json) and the engine's tensor parallelism (training's GPUs per engine). Both
    are fields of SGLang 0.5.15.post1's ServerArgs (python/sglang/srt/server_args.py, lines 470
    and 816), whose CLI flag is the field's name."""
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model)]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    if context_length:
        command += ["--context-length", str(context_length)]
    if tensor_parallel > 1:
        command += ["--tp-size", str(tensor_parallel)]
    return command


@contextmanager
def sglang_server(
    model: Path,
    log_path: Path,
    context_length: int = 0,
    tensor_parallel: int = 1,
    timeout_s: float = READY_TIMEOUT_S,
) -> Iterator[str]:
    port = _free_port()
    command = server_command(model, port, context_length, tensor_parallel)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=5, trust_env=False).status_code == 200
        except httpx.TransportError:
            return False

    with serving_group(command, log_path, ready, "SGLang", timeout_s, SGLangStartError):
        yield url
