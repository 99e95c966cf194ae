"""Step 5: a short slime run as `deepdive submit` would start it, then its checkpoint's round
trip through slime's conversion tools, on node 0.

The recipe follows slime's scripts/run-qwen2.5-0.5B-reproducibility.sh (624b824): the
qwen2.5-0.5B preset, colocated actor and rollout on the node's GPUs, GRPO with lr 1e-6 and
that script's other flags (REFERENCE_FLAGS); with our hooks on the offline world (the tool
server over its pages, the rule judge: no key, no network) and ROLLOUTS rollouts, slime
saving the last.
It runs through the launcher's own pieces: the checks before submission (check_slime), the
conversion of the model (`deepdive convert-checkpoint to-megatron`'s plan), the node
bootstrap with the slime backend (Ray, services, train.py with the backend's environment).
Then the round trip: the trained checkpoint to Hugging Face, back to torch_dist, to Hugging
Face again; both Hugging Face folders hold every tensor of the original model, and the second
equals the first.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

from services.base.errors import DeepDiveError
from slurm.backends.slime.args import slime_arguments
from slurm.backends.slime.checks import check_slime
from slurm.backends.slime.config import (
    SlimeCheckpoint,
    SlimeModel,
    SlimeResources,
    SlimeRollout,
    SlimeSection,
    SlimeSGLang,
)
from slurm.backends.slime.conversion import Conversion, plan, run_to_folder
from slurm.bootstrap import NodeBootstrap
from slurm.config import ExperimentConfig, ServiceTable
from slurm.node.environment import NodeInfo
from slurm.run_folder import write_json
from slurm.smoke import world
from slurm.smoke.context import SmokeContext
from slurm.smoke.gpus import no_gpu, torch_gpus
from slurm.smoke.ray_step import bootstrap_checks
from slurm.smoke.report import Check, failed, passed

PRESET = "qwen2.5-0.5B"
ROLLOUTS = 10  # about a minute each for a 0.5B model on one node: the 10-minute run
TRAIN_LIMIT_S = 2400.0  # the run is stopped (and the step fails) after this long
GPUS_PER_NODE_FLAG = "--num-gpus-per-node"  # slime's default is 8 (slime/utils/arguments.py:67)
# What slime's scripts/run-qwen2.5-0.5B-reproducibility.sh (624b824) passes and the launcher's
# builder may not emit: added when it does not. Not taken from it: its deterministic-mode
# flags, wandb, the eval set and --rm-type math (that script's purpose, not this run's: our
# hooks score the episodes), --sequence-parallel at TP 1 (the config refuses it below TP 2),
# and its sizes (100 rollouts of 32 x 8 samples do not fit ten minutes).
REFERENCE_FLAGS = (
    ("--use-dynamic-batch-size",),
    ("--max-tokens-per-gpu", "9216"),
    ("--attention-dropout", "0.0"),
    ("--hidden-dropout", "0.0"),
    ("--accumulate-allreduce-grads-in-fp32",),
    ("--attention-softmax-in-fp32",),
    ("--attention-backend", "flash"),
    ("--rollout-shuffle",),
)


def recipe(
    config: ExperimentConfig, folder: Path, model: str, ref_load: str, prompts: Path,
    tools: ServiceTable, gpus: int,
) -> ExperimentConfig:  # fmt: skip
    """The smoke run's experiment: one node, the image's slime paths, the rest fixed."""
    image = config.slime
    section = SlimeSection(
        slime_root=image.slime_root,
        python_path=list(image.python_path),
        socket_ifname=image.socket_ifname,
        model=SlimeModel(preset=PRESET, hf_checkpoint=model, ref_load=ref_load),
        checkpoint=SlimeCheckpoint(save_interval=ROLLOUTS),
        resources=SlimeResources(
            actor_num_nodes=1,
            actor_num_gpus_per_node=gpus,
            rollout_num_gpus=gpus,
            rollout_num_gpus_per_engine=1,
            colocate=True,
        ),
        rollout=SlimeRollout(
            prompt_data=str(prompts),
            rollout_batch_size=8,
            n_samples_per_prompt=4,
            global_batch_size=32,
            num_rollout=ROLLOUTS,
            max_context_len=8192,
            max_response_len=1024,
        ),
        sglang=SlimeSGLang(mem_fraction_static=0.7),
    )
    section = dataclasses.replace(
        section,
        optimizer=dataclasses.replace(section.optimizer, lr=1e-6),
        # the reproducibility script's micro-batch packing, not the builder's default
        parallelism=dataclasses.replace(section.parallelism, max_tokens_per_gpu=9216),
        deepdive=dataclasses.replace(section.deepdive, max_turns=4),
    )
    probe = dataclasses.replace(config, slime=section)
    emitted = slime_arguments(probe, folder / "probe.yaml").flags()
    wanted = [*REFERENCE_FLAGS, (GPUS_PER_NODE_FLAG, str(gpus))]
    extra = [item for flag in wanted if flag[0] not in emitted for item in flag]
    section = dataclasses.replace(section, extra_args=extra)
    return dataclasses.replace(
        config,
        run=dataclasses.replace(
            config.run, name=f"{config.run.name}-smoke", folder=str(folder), backend="slime"
        ),
        slurm=dataclasses.replace(config.slurm, nodes=1, gpus_per_node=gpus),
        services=dataclasses.replace(
            config.services, host="127.0.0.1", tools=tools, reward={"judge": "rule"}
        ),
        slime=section,
    )


def conversion_environment(
    python_path: list[str], base: dict[str, str], port: int
) -> dict[str, str]:
    """A conversion tool's environment inside a job of several tasks: slime's
    tools/convert_hf_to_torch_dist.py (lines 93-95) takes its world size from WORLD_SIZE, else
    Slurm's task count, so in a 2-node job it would wait for a second rank forever; it is one
    process here, on a store port of its own (the tool's default is 12355)."""
    paths = [*python_path, base.get("PYTHONPATH", "")]
    return {
        **base,
        "PYTHONPATH": ":".join(path for path in paths if path),
        "PYTHONUNBUFFERED": "1",
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def convert(context: SmokeContext, config: ExperimentConfig, conversion: Conversion) -> float:
    """Run one conversion (into a partial folder, renamed on success); its seconds."""
    started = time.monotonic()
    port = context.ports().ray_gcs
    environment = conversion_environment(config.slime.python_path, dict(os.environ), port)
    run_to_folder(
        lambda folder: conversion.command(context.python, folder), conversion.output, environment
    )
    return time.monotonic() - started


def run(context: SmokeContext) -> list[Check]:
    gpus, _ = torch_gpus()
    if gpus == 0:
        return [failed("slime run", no_gpu("the slime run"))]
    model = context.model
    if not model or not (Path(model) / "config.json").is_file():
        return [
            failed(
                "slime run",
                f"no model: --model {model or '(not given)'} must be a Hugging Face folder "
                "(Qwen2.5-0.5B-Instruct)",
            )
        ]
    folder = context.step_folder("5-slime") / "run"
    converted = folder / "converted"
    data = world.write(folder / "world")
    reference = converted / f"{Path(model).name}_torch_dist"
    config = recipe(
        context.config, folder, model, str(reference), data.prompts, data.tools_table(), gpus
    )
    seconds = convert(context, config, plan(config, "to-megatron"))
    checks = [passed("to-megatron", f"{model} -> {reference} in {seconds:.0f} s")]
    try:  # what `deepdive submit` checks (the reference checkpoint must exist by now)
        check_slime(config)
    except DeepDiveError as error:
        return [*checks, failed("the launcher's checks", error.message)]
    checks.append(passed("the launcher's checks", f"the recipe passes check_slime ({PRESET})"))
    checks += train(config, context.node)
    if not all(check.ok for check in checks):
        return checks
    checks += round_trip(context, config, Path(model), converted)
    return checks


def train(config: ExperimentConfig, node: NodeInfo) -> list[Check]:
    """train.py under the node bootstrap (this node alone), stopped after TRAIN_LIMIT_S."""
    alone = dataclasses.replace(node, node=0, num_nodes=1)
    attempt = config.run_folder.attempt(alone.attempt)
    late = threading.Event()

    def stop() -> None:
        late.set()
        write_json(attempt.end, {"stopped": "the GPU smoke kit's time limit", "t": time.time()})

    timer = threading.Timer(TRAIN_LIMIT_S, stop)
    timer.daemon = True
    started = time.monotonic()
    timer.start()
    try:
        code = NodeBootstrap(config, alone).run()
    finally:
        timer.cancel()
    minutes = (time.monotonic() - started) / 60
    if late.is_set():
        return [
            failed(
                "slime run",
                f"did not finish {ROLLOUTS} rollouts within {TRAIN_LIMIT_S / 60:.0f} min; "
                f"stopped (its log: {attempt.node_log(0)})",
            )
        ]
    checks = bootstrap_checks(config, alone, code, "slime's train.py")
    if code == 0:
        checks.append(passed("slime run", f"{ROLLOUTS} rollouts in {minutes:.1f} min"))
    return checks


def round_trip(
    context: SmokeContext, config: ExperimentConfig, model: Path, converted: Path
) -> list[Check]:
    first = plan(config, "to-hf", "latest")
    seconds = convert(context, config, first)
    checks = [passed("to-hf", f"the trained checkpoint -> {first.output} in {seconds:.0f} s")]
    back = dataclasses.replace(
        config,
        slime=dataclasses.replace(
            config.slime,
            model=dataclasses.replace(
                config.slime.model,
                hf_checkpoint=str(first.output),
                ref_load=str(converted / "round_trip_torch_dist"),
            ),
        ),
    )
    megatron = plan(back, "to-megatron")
    seconds = convert(context, back, megatron)
    checks.append(
        passed("to-megatron again", f"{first.output} -> {megatron.output} in {seconds:.0f} s")
    )
    again = Conversion(
        "to-hf",
        first.tool,
        [
            "--input-dir",
            str(megatron.output / "release"),
            "--origin-hf-dir",
            str(model),
            "--output-dir",
        ],
        converted / "round_trip_hf",
    )
    convert(context, config, again)
    original = load_tensors(model)
    trained, returned = load_tensors(first.output), load_tensors(again.output)
    checks.append(covers("to-hf keeps the model's tensors", original, trained))
    checks.append(same_tensors("round trip", trained, returned))
    return checks


def load_tensors(folder: Path) -> dict[str, Any]:
    """Every tensor of a Hugging Face folder's safetensors files, by name."""
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no .safetensors file")
    for path in files:
        tensors.update(load_file(str(path)))
    return tensors


def covers(name: str, original: dict[str, Any], converted: dict[str, Any]) -> Check:
    """Every tensor of the original model is in the converted folder, with its shape."""
    missing = [key for key in original if key not in converted]
    reshaped = [
        f"{key} {tuple(converted[key].shape)} (was {tuple(value.shape)})"
        for key, value in original.items()
        if key in converted and tuple(converted[key].shape) != tuple(value.shape)
    ]
    if missing or reshaped:
        problems = [f"missing {', '.join(missing[:5])}"] if missing else []
        problems += [f"reshaped {', '.join(reshaped[:5])}"] if reshaped else []
        return failed(name, "; ".join(problems))
    extra = len(converted) - len(original)
    more = f" (and {extra} more, e.g. a tied lm_head)" if extra > 0 else ""
    return passed(name, f"all {len(original)} tensors, same shapes{more}")


def same_tensors(name: str, first: dict[str, Any], again: dict[str, Any]) -> Check:
    """`again` holds the same tensors as `first`, bit for bit."""
    import torch

    if set(first) != set(again):
        gone = sorted(set(first) - set(again))[:5]
        new = sorted(set(again) - set(first))[:5]
        return failed(name, f"other tensor names: lost {gone}, gained {new}")
    differ = []
    for key, value in first.items():
        other = again[key]
        if value.dtype != other.dtype or not torch.equal(value, other):
            gap = (
                (value.float() - other.float()).abs().max().item()
                if value.shape == other.shape
                else None
            )
            differ.append(f"{key} ({other.dtype} vs {value.dtype}, max |diff| {gap})")
    if differ:
        return failed(
            name, f"{len(differ)} of {len(first)} tensors changed: {'; '.join(differ[:3])}"
        )
    return passed(name, f"to-hf -> to-megatron -> to-hf: all {len(first)} tensors identical")
