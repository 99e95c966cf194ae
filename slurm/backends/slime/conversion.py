"""`deepdive convert-checkpoint to-megatron|to-hf CONFIG`: slime's conversion tools as Slurm jobs
of the same CLI and config, on one GPU node in the training image.

- to-megatron: tools/convert_hf_to_torch_dist.py with the model's architecture arguments (the
  preset's) turns `slime.model.hf_checkpoint` into the torch_dist checkpoint training loads as
  `--ref-load` (written at `slime.model.ref_load`, or RUN/converted/NAME_torch_dist). It runs
  as slime documents for large models (docs/en/get_started/quick_start.md, "Model Weight
  Conversion"): under torchrun, one process per GPU of the node, the tool splitting the layers
  into that many pipeline stages (its `get_args`); one process would hold a 32B model on one
  GPU. The embedding is written padded as training pads it (`--padded-vocab-size`: Megatron
  pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP,
  megatron/training/tokenizer/tokenizer.py, line 110), or training could not load it at TP 8;
- to-hf: tools/convert_torch_dist_to_hf.py turns a training checkpoint (`--iteration N` or
  `latest`, the tracker's) into a Hugging Face folder SGLang and `deepdive eval` serve
  (RUN/converted/iter_NNNNNNN_hf), cutting Megatron's padding off the embedding and output
  layer (`--vocab-size`: the model's own, config.json's; slime's quick start says to set it,
  tools/convert_torch_dist_to_hf.py strips to it with `remove_padding`). One process: the tool
  loads without torch.distributed.

The tool writes into a partial folder beside the target; only a conversion that exits 0 is
renamed into place (services.base.files.publish), so a job that dies leaves nothing a later job
could mistake for complete.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit

from services.base.errors import ConfigError, RuntimeFailure
from services.base.files import partial_path, publish, remove
from services.base.process import child_preexec
from slurm import requeue
from slurm.backends.slime.args import architecture, slime_checkpoints
from slurm.backends.slime.retention import TRACKER
from slurm.config import ExperimentConfig
from slurm.launch.task_command import python_command, srun_cpus, submitit_folder


class ConversionFailed(RuntimeFailure):
    code = "conversion_failed"


@dataclass(frozen=True)
class Conversion:
    direction: str  # to-megatron | to-hf
    tool: str  # slime's script
    arguments: list[str]  # the tool's arguments, the output flag last
    output: Path
    processes: int = 1  # > 1: under torchrun, one process per GPU

    def command(self, python: str, output: Path) -> list[str]:
        launcher = [python]
        if self.processes > 1:  # torchrun, as the module its entry point runs
            launcher += ["-m", "torch.distributed.run", "--standalone"]
            launcher += ["--nproc-per-node", str(self.processes)]
        return [*launcher, self.tool, *self.arguments, str(output)]


def padded_vocab_size(vocab: int, tensor: int, divisible_by: int = 128) -> int:
    """Megatron's padded vocabulary (megatron/training/tokenizer/tokenizer.py, line 110)."""
    multiple = divisible_by * tensor
    return -(-vocab // multiple) * multiple


def _flag_value(arguments: list[str], flag: str) -> str | None:
    return arguments[arguments.index(flag) + 1] if flag in arguments[:-1] else None


def model_vocab_size(config: ExperimentConfig) -> int:
    """The model's vocabulary: config.json's (what the Hugging Face side expects), else the
    architecture's --vocab-size."""
    from slurm.backends.slime.model_context import read_config, text_config

    found = text_config(read_config(config.slime.model.hf_checkpoint)).get("vocab_size")
    if isinstance(found, int) and found > 0:
        return found
    flagged = _flag_value(architecture(config.slime), "--vocab-size")
    if flagged is None or not flagged.isdigit():
        raise ConfigError(
            f"slime.model.hf_checkpoint: {config.slime.model.hf_checkpoint}/config.json has no "
            "vocab_size and the architecture no --vocab-size"
        )
    return int(flagged)


def converted(config: ExperimentConfig) -> Path:
    return config.run_folder.root / "converted"


def iteration_folder(config: ExperimentConfig, iteration: str) -> tuple[int, Path]:
    """A training checkpoint: iteration N, or the newest complete one (Megatron's tracker)."""
    folder = slime_checkpoints(config)
    if iteration == "latest":
        try:
            iteration = (folder / TRACKER).read_text().strip()
        except OSError:
            raise ConfigError(
                f"--iteration latest: {folder} has no complete checkpoint ({TRACKER} missing)"
            ) from None
    if not iteration.isdigit():
        raise ConfigError(f"--iteration: expected a number or latest, got {iteration!r}")
    path = folder / f"iter_{int(iteration):07d}"
    if not path.is_dir():
        raise ConfigError(f"--iteration {iteration}: no checkpoint at {path}")
    return int(iteration), path


def plan(config: ExperimentConfig, direction: str, iteration: str = "latest") -> Conversion:
    slime = config.slime
    tools = Path(slime.slime_root) / "tools"
    hf = slime.model.hf_checkpoint
    if not hf or not (Path(hf) / "config.json").is_file():
        raise ConfigError(f"slime.model.hf_checkpoint: {hf or '(unset)'} has no config.json")
    if direction == "to-megatron":
        output = (
            Path(slime.model.ref_load)
            if slime.model.ref_load
            else (converted(config) / f"{Path(hf).name}_torch_dist")
        )
        model_args = architecture(slime)
        divisible = _flag_value(model_args, "--make-vocab-size-divisible-by") or "128"
        padded = padded_vocab_size(
            model_vocab_size(config), slime.parallelism.tensor, int(divisible)
        )
        arguments = [*model_args, "--padded-vocab-size", str(padded), "--hf-checkpoint", hf]
        arguments.append("--save")
        layers = _flag_value(model_args, "--num-layers")
        # the tool asserts no more processes than layers
        processes = min(max(1, config.slurm.gpus_per_node), int(layers or 1))
        tool = str(tools / "convert_hf_to_torch_dist.py")
        return Conversion(direction, tool, arguments, output, processes)
    if direction == "to-hf":
        number, source = iteration_folder(config, iteration)
        output = converted(config) / f"iter_{number:07d}_hf"
        arguments = ["--input-dir", str(source), "--origin-hf-dir", hf]
        arguments += ["--vocab-size", str(model_vocab_size(config)), "--output-dir"]
        return Conversion(direction, str(tools / "convert_torch_dist_to_hf.py"), arguments, output)
    raise ConfigError(f"convert-checkpoint: expected to-megatron or to-hf, got {direction!r}")


def run_to_folder(
    build: Callable[[Path], list[str]], output: Path, environment: dict[str, str] | None = None
) -> None:
    """Run the tool `build(folder)` returns, writing a folder: into a partial beside `output`,
    renamed in on exit 0; removed, and `output` untouched, on anything else."""
    if output.exists():
        raise ConfigError(f"{output} exists already: remove it to convert again")
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(output)
    argv = build(partial)
    try:
        code = subprocess.call(argv, env=environment, preexec_fn=child_preexec)  # noqa: S603
    except BaseException:
        remove(partial)
        raise
    if code != 0 or not partial.exists():
        remove(partial)
        tool = next((Path(item).name for item in argv if item.endswith(".py")), Path(argv[0]).name)
        raise ConversionFailed(f"{tool} exited with status {code}; nothing was written to {output}")
    publish(partial, output, replace=False)


class ConversionJob:
    """What the conversion job runs on its node (submitit pickles it: the config, no secret)."""

    def __init__(self, config: ExperimentConfig, conversion: Conversion) -> None:
        self.config = config
        self.conversion = conversion

    def __call__(self) -> str:
        slime = self.config.slime
        environment = {"PYTHONPATH": ":".join(slime.python_path), "PYTHONUNBUFFERED": "1"}
        conversion = self.conversion
        started = time.monotonic()
        run_to_folder(
            lambda folder: conversion.command(sys.executable, folder),
            conversion.output,
            {**os.environ, **environment},
        )
        print(f"converted in {time.monotonic() - started:.0f} s: {self.conversion.output}")
        return str(self.conversion.output)


def executor_parameters(config: ExperimentConfig) -> dict[str, Any]:
    """One node, one task, the job's GPUs per node: the conversion tools load the model there."""
    slurm = config.slurm
    parameters: dict[str, Any] = {
        "job_name": f"{config.run.name}-convert",
        "nodes": 1,
        "ntasks_per_node": 1,
        "time": slurm.time_min,
        "gpus_per_node": max(1, slurm.gpus_per_node),
        # the training job's warning signal (python_command names it inside an image)
        "setup": requeue.signal_setup(),
        "additional_parameters": {"signal": requeue.sbatch_signal(90)},
    }
    for name in ("partition", "account", "qos", "constraint"):
        if getattr(slurm, name):
            parameters[name] = getattr(slurm, name)
    if slurm.cpus_per_task:
        parameters["cpus_per_task"] = slurm.cpus_per_task
        parameters["srun_args"] = srun_cpus(config)  # srun 22.05-23.02 does not pass it on
    return parameters


def submit(config: ExperimentConfig, conversion: Conversion) -> str:
    executor = submitit.SlurmExecutor(folder=submitit_folder(config), python=python_command(config))
    executor.update_parameters(**executor_parameters(config))
    return str(executor.submit(ConversionJob(config, conversion)).job_id)
