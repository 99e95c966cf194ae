"""Out of memory on 80 GB GPUs, caught before submission: the recipe carries slime's own 32B
settings (scripts/run-qwen3-32B.sh at 624b824: full recompute of every layer, dynamic batch
size, Adam's states in CPU memory), and the checks estimate a training GPU's memory and warn,
with the arithmetic, when it passes `slime.resources.gpu_memory_mib`; and a node's host memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm.backends.slime.args import slime_arguments
from slurm.backends.slime.checks import check_slime, host_memory_warnings
from slurm.backends.slime.memory_estimate import estimate, host_estimate
from tests.helpers import QWEN25_32B, slime_dry_run
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


GIB = 2**30


def test_the_estimate_is_the_documented_arithmetic(world: dict[str, Path]) -> None:
    found = estimate(recipe(world), QWEN25_32B)
    assert found is not None
    terms = {what: gib for what, gib, _ in found.terms}
    shard = PARAMETERS / 4  # TP 4, PP 1
    assert terms["weights"] == pytest.approx(2 * shard / GIB)  # 15.3 GiB in bf16
    assert terms["gradients"] == pytest.approx(4 * shard / GIB)  # fp32 accumulation
    assert terms["optimizer"] == 0.0  # in CPU memory
    # the longest episode (32768 tokens) runs alone, past the 20480-token cap: each of the 64
    # layers keeps its input (sequence-parallel over TP 4), one layer is recomputed at a time
    kept = 64 * 32768 * 2 * 5120 / 4
    layer = 32768 * (2 * 4 * 5120 / 4 + 2 * (5120 + 2 * 1024 + 2 * 5120) / 4 + 2 * 3 * 27648 / 4)
    assert terms["activations"] == pytest.approx((kept + layer) / GIB)
    assert terms["logits"] == pytest.approx(2 * 4 * 32768 * 152064 / 4 / GIB)
    # slime's fp32 softmax of the 38016-token vocabulary shard, kept for backward (2a5d2bd had
    # no such term): 4.6 GiB, the "about 5 GB" of a 32k x 38k shard
    assert terms["log-softmax"] == pytest.approx(4 * 32768 * 38016 / GIB)
    assert found.total_gib == pytest.approx(71.5, abs=0.1)
    # GiB against the GPU's MiB as nvidia-smi says them (an H100 80 GB: 81559 MiB)
    assert found.budget_gib == pytest.approx(81559 / 1024)
    assert found.fits() and check_slime(recipe(world)) == []


def test_an_entropy_loss_adds_its_gradient_buffer_and_chunking_shrinks_it(
    world: dict[str, Path],
) -> None:
    config = recipe(world, "slime.algorithm.entropy_coef=0.01")
    whole = estimate(config, QWEN25_32B, chunk_size=0)
    chunked = estimate(config, QWEN25_32B, chunk_size=8192)
    assert whole is not None and chunked is not None
    softmax = 4 * 32768 * 38016 / GIB
    assert dict((w, g) for w, g, _ in whole.terms)["log-softmax"] == pytest.approx(2 * softmax)
    assert dict((w, g) for w, g, _ in chunked.terms)["log-softmax"] == pytest.approx(
        softmax + 4 * 8192 * 38016 / GIB
    )


def test_the_chunk_size_is_passed_when_the_logits_peak_would_not_fit_otherwise(
    world: dict[str, Path],
) -> None:
    """76.2 GiB unchunked on a 74.2 GiB GPU; 72.7 GiB with 8192-token chunks. On 2a5d2bd the
    argv never passed --log-probs-chunk-size and the estimate left the log-softmax out."""
    tight = ("slime.algorithm.entropy_coef=0.01", "slime.resources.gpu_memory_mib=76000")
    arguments = slime_arguments(recipe(world, *tight), Path("/x.yaml")).arguments()
    assert arguments[arguments.index("--log-probs-chunk-size") + 1] == "8192"
    assert check_slime(recipe(world, *tight)) == []  # it fits, chunked
    roomy = slime_arguments(recipe(world), Path("/x.yaml")).arguments()
    assert "--log-probs-chunk-size" not in roomy  # fits unchunked: slime's default
    never = (*tight, "slime.parallelism.log_probs_chunk_size=0")
    unchunked = slime_arguments(recipe(world, *never), Path("/x.yaml")).arguments()
    assert "--log-probs-chunk-size" not in unchunked
    warnings = check_slime(recipe(world, *never))
    assert warnings and "log-softmax" in warnings[0] and "74.2 GiB per GPU" in warnings[0]


def test_without_slimes_32b_settings_the_checks_warn_with_the_arithmetic(
    world: dict[str, Path],
) -> None:
    warnings = check_slime(recipe(world, *WITHOUT_32B_SETTINGS))
    assert warnings and len(warnings) == 1
    warning = warnings[0]
    assert "a training GPU may run out of memory: about 206 GiB needed" in warning
    assert "gpu_memory_mib = 81559 (79.6 GiB)" in warning
    assert "no recompute: 32768 tokens x 64 layers" in warning
    assert "12 bytes x params/GPU / DP x CP 4" in warning  # 16 GPUs / TP 4


def test_a_larger_gpu_is_taken_at_its_word(world: dict[str, Path]) -> None:
    h200 = "slime.resources.gpu_memory_mib=143771"  # nvidia-smi's memory.total of an H200
    config = recipe(world, "slime.optimizer.cpu_offload=false", h200)
    assert check_slime(config) == []  # 94 GiB fits an H200
    assert check_slime(recipe(world, "slime.optimizer.cpu_offload=false"))  # not an 80 GB GPU


def test_a_nodes_host_memory_is_the_documented_arithmetic(world: dict[str, Path]) -> None:
    """Per node of 8 actor GPUs (2a5d2bd estimated no host memory): Adam's states on the CPU
    (16 bytes per parameter of each rank's shard over DP x CP 4), slime's pinned backups of the
    actor and of the reference (KL loss on), an allowance per GPU."""
    found = host_estimate(recipe(world), QWEN25_32B, node_gib=2048)
    assert found is not None
    terms = {what: gib for what, gib, _ in found.terms}
    shard = PARAMETERS / 4
    assert terms["Adam on CPU"] == pytest.approx(8 * 16 * shard / 4 / GIB)  # 244 GiB
    assert terms["weight backups"] == pytest.approx(8 * 2 * shard * 2 / GIB)  # 244 GiB
    assert "memory saver" not in terms  # Adam is on the CPU already: nothing left to back up
    assert terms["runtime"] == 8 * 6.0
    assert found.total_gib == pytest.approx(536.2, abs=0.1) and found.fits()
    on_gpu = host_estimate(recipe(world, *WITHOUT_32B_SETTINGS), QWEN25_32B, node_gib=2048)
    assert on_gpu is not None
    saver = {what: gib for what, gib, _ in on_gpu.terms}
    assert "Adam on CPU" not in saver
    # --offload with Adam on the GPU: torch_memory_saver copies its states to the host
    assert saver["memory saver"] == pytest.approx(8 * 12 * shard / 4 / GIB)
    no_kl = host_estimate(
        recipe(world, "slime.algorithm.use_kl_loss=false"), QWEN25_32B, node_gib=2048
    )
    assert no_kl is not None
    assert dict((w, g) for w, g, _ in no_kl.terms)["weight backups"] == pytest.approx(
        8 * 2 * shard / GIB
    )


def test_a_node_with_too_little_memory_is_warned_about(world: dict[str, Path]) -> None:
    warnings = host_memory_warnings(recipe(world), (512.0, "slurm.mem_gb"))
    assert len(warnings) == 1
    assert (
        "a node may run out of host memory: about 536 GiB needed, the node has 512 GiB"
        in (warnings[0])
    )
    assert "weight backups" in warnings[0]
    assert host_memory_warnings(recipe(world), (2048.0, "Slurm")) == []
    unknown = host_memory_warnings(recipe(world), None)
    assert unknown and "was not checked" in unknown[0]


def test_a_mixture_of_experts_is_not_estimated(world: dict[str, Path]) -> None:
    assert estimate(recipe(world), {**QWEN25_32B, "num_experts": 128}) is None


def test_the_dry_run_prints_the_warning(world: dict[str, Path]) -> None:
    result = slime_dry_run(world, *WITHOUT_32B_SETTINGS)
    assert result.returncode == 0, result.stderr
    assert "warning: a training GPU may run out of memory" in result.stderr
    assert "activations" in result.stderr and "of 79.6 GiB per GPU" in result.stderr


def test_with_mem_0_the_nodes_memory_comes_from_slurm(
    world: dict[str, Path], job_env: dict[str, str]
) -> None:
    """The recipe asks for whole nodes (mem_gb = 0, exclusive): the private cluster's nodes
    have RealMemory=6000 (scripts/local-slurm.sh), which sinfo reports and the dry run holds
    the host estimate to."""
    result = slime_dry_run(world, env=job_env)
    assert result.returncode == 0, result.stderr
    assert (
        "a node may run out of host memory: about 536 GiB needed, the node has 6 GiB "
        "(Slurm's smallest RealMemory in the cluster, 6000 MiB)"
    ) in result.stderr
