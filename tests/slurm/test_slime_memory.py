"""Out of memory on 80 GB GPUs, caught before submission: the recipe carries slime's own 32B
settings (scripts/run-qwen3-32B.sh at 624b824: full recompute of every layer, dynamic batch
size, Adam's states in CPU memory), and the checks estimate a training GPU's memory and warn,
with the arithmetic, when it passes `slime.resources.gpu_memory_gb`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slurm.backends.slime.args import slime_arguments
from slurm.backends.slime.checks import check_slime
from slurm.backends.slime.memory_estimate import estimate
from tests.helpers import DEEPDIVE, QWEN25_32B
from tests.helpers import SLIME_RECIPE as RECIPE
from tests.helpers import slime_overrides as overrides
from tests.helpers import slime_recipe as recipe

# the recipe as it was before slime's 32B settings: no recompute, one sample per micro-batch,
# Adam's states on the GPU
WITHOUT_32B_SETTINGS = (
    'slime.parallelism.recompute_granularity=""',
    'slime.parallelism.recompute_method=""',
    "slime.parallelism.recompute_num_layers=0",
    "slime.parallelism.use_dynamic_batch_size=false",
    "slime.optimizer.cpu_offload=false",
)
# Qwen2.5-32B by hand: 64 layers x (attention 5120 x 128 x (2 x 40 + 2 x 8) + SwiGLU 3 x 5120
# x 27648) + untied input and output embeddings 2 x 152064 x 5120
PARAMETERS = 64 * (5120 * 128 * 96 + 3 * 5120 * 27648) + 2 * 152064 * 5120


def test_the_recipe_passes_slimes_32b_memory_settings(world: dict[str, Path]) -> None:
    arguments = slime_arguments(recipe(world), Path("/x.yaml")).arguments()
    for flag, value in (
        ("--recompute-granularity", "full"),
        ("--recompute-method", "uniform"),
        ("--recompute-num-layers", "1"),
        ("--max-tokens-per-gpu", "20480"),
    ):
        assert arguments[arguments.index(flag) + 1] == value
    for switch in (
        "--use-dynamic-batch-size",
        "--optimizer-cpu-offload",
        "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
    ):
        assert switch in arguments


def test_the_estimate_is_the_documented_arithmetic(world: dict[str, Path]) -> None:
    found = estimate(recipe(world), QWEN25_32B)
    assert found is not None
    terms = {what: gb for what, gb, _ in found.terms}
    shard = PARAMETERS / 4  # TP 4, PP 1
    assert terms["weights"] == pytest.approx(2 * shard / 1e9)  # 16.4 GB in bf16
    assert terms["gradients"] == pytest.approx(4 * shard / 1e9)  # fp32 accumulation
    assert terms["optimizer"] == 0.0  # in CPU memory
    # the longest episode (32768 tokens) runs alone, past the 20480-token cap: each of the 64
    # layers keeps its input (sequence-parallel over TP 4), one layer is recomputed at a time
    kept = 64 * 32768 * 2 * 5120 / 4
    layer = 32768 * (2 * 4 * 5120 / 4 + 2 * (5120 + 2 * 1024 + 2 * 5120) / 4 + 2 * 3 * 27648 / 4)
    assert terms["activations"] == pytest.approx((kept + layer) / 1e9)
    assert terms["logits"] == pytest.approx(2 * 4 * 32768 * 152064 / 4 / 1e9)
    assert found.total_gb == pytest.approx(71.5, abs=0.1)
    assert found.fits() and check_slime(recipe(world)) == []


def test_without_slimes_32b_settings_the_checks_warn_with_the_arithmetic(
    world: dict[str, Path],
) -> None:
    warnings = check_slime(recipe(world, *WITHOUT_32B_SETTINGS))
    assert warnings and len(warnings) == 1
    warning = warnings[0]
    assert "a training GPU may run out of memory: about 215 GB needed" in warning
    assert "gpu_memory_gb = 80" in warning
    assert "no recompute: 32768 tokens x 64 layers" in warning
    assert "12 bytes x params/GPU / DP x CP 4" in warning  # 16 GPUs / TP 4


def test_a_larger_gpu_is_taken_at_its_word(world: dict[str, Path]) -> None:
    config = recipe(world, "slime.optimizer.cpu_offload=false", "slime.resources.gpu_memory_gb=141")
    assert check_slime(config) == []  # 96 GB fits an H200
    assert check_slime(recipe(world, "slime.optimizer.cpu_offload=false"))  # not an 80 GB GPU


def test_a_mixture_of_experts_is_not_estimated(world: dict[str, Path]) -> None:
    assert estimate(recipe(world), {**QWEN25_32B, "num_experts": 128}) is None


def test_the_dry_run_prints_the_warning(world: dict[str, Path]) -> None:
    arguments = [
        item for value in overrides(world, *WITHOUT_32B_SETTINGS) for item in ("--set", value)
    ]
    result = subprocess.run(
        [*DEEPDIVE, "submit", str(RECIPE), "--dry-run", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=world["root"],
    )
    assert result.returncode == 0, result.stderr
    assert "warning: a training GPU may run out of memory" in result.stderr
    assert "activations" in result.stderr and "of 80 GB per GPU" in result.stderr
