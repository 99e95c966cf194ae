"""What a node has in GPUs, as the driver and torch see it: the pieces several steps share."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from services.base.errors import RuntimeFailure

QUERY = ("index", "name", "driver_version", "memory.total", "memory.used")


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    driver: str
    memory_total_mib: int
    memory_used_mib: int


class NoDriver(RuntimeFailure):
    """nvidia-smi is missing or cannot reach the driver."""


def parse_gpu_query(text: str) -> list[Gpu]:
    """`nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used
    --format=csv,noheader,nounits` output, one GPU a line."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != len(QUERY):
            raise ValueError(f"nvidia-smi: expected {len(QUERY)} fields, got {line!r}")
        index, name, driver, total, used = fields
        gpus.append(Gpu(int(index), name, driver, _mib(total), _mib(used)))
    return gpus


def _mib(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:  # "[N/A]" on some boards
        return 0


def nvidia_smi() -> list[Gpu]:
    """The GPUs the driver shows this process (inside `apptainer exec --nv`, the host's)."""
    if shutil.which("nvidia-smi") is None:
        raise NoDriver(
            "nvidia-smi not found on PATH: no NVIDIA driver here (in the image, "
            "`apptainer exec --nv` brings the host's: is [container] nv = true?)"
        )
    command = ["nvidia-smi", f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"]
    result = subprocess.run(  # noqa: S603 (fixed arguments)
        command, capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        message = (result.stdout + result.stderr).strip().splitlines()
        raise NoDriver(f"nvidia-smi exited with status {result.returncode}: {' '.join(message)}")
    return parse_gpu_query(result.stdout)


def torch_gpus() -> tuple[int, str]:
    """How many GPUs torch sees, and its build in words."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    build = f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none (a CPU build)'}"
    return count, build


def no_gpu(what: str) -> str:
    """The one way every step says it found no GPU."""
    count, build = torch_gpus()
    return f"no GPU: {what} needs one and torch.cuda.device_count() is {count} ({build})"
