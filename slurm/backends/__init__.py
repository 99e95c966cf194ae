"""Training backends: what node 0 trains with, behind one seam the launcher calls.

Before submission a backend checks its own config (`check`, returning warnings), says whether
a run folder's saved config may be continued (`check_continues`) and lists the inputs it reads
that are not on disk yet (`missing_inputs`). On the job it says what data must exist before
the services start (`prepare`, on node 0), which services every node runs for it
(`services`), the command node 0 runs to train (`command`, the job's exit code is that
command's) and what a new attempt resumes from (`resume_point`). `deepdive eval` serves its
checkpoints with the backend's engine (`eval_engine`). `local` is the CPU GRPO of `deepdive
run`, spread over the job's nodes through Ray; `slime` is slime's train.py with our hooks.
Nothing outside this package asks which backend it is (tests/test_backend_seam.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from services.base.errors import ConfigError

# light: slurm.config imports the slime backend's tables from this package (`deepdive status
# --help` among others), so what is only needed at run time is imported there
if TYPE_CHECKING:
    from deepdive.rollout_settings import RolloutKnobs
    from slurm.config import ExperimentConfig
    from slurm.run_folder import AttemptFolder


@dataclass(frozen=True)
class ServiceSpec:
    """One service every node runs: its name (also its port's name in the port plan, its log's
    and its config file's), which of `python -m services` it is, and its config file's table
    (the service's config dataclass as TOML: what differs from its defaults). `workers`: None
    for a service of one process; a tool server's worker processes (`--workers`), 0 for one
    per core of the node's task (`services.tool_workers`' default). On the command line only
    what the launcher decides: the config file, the log level, the workers (and the address)."""

    name: str
    service: str  # tools | reward
    config: dict[str, Any] = field(default_factory=dict)
    workers: int | None = None
    log_level: str = "WARNING"

    def worker_count(self, cores: int | None) -> int:
        """Its processes on a node with `cores` CPUs (None: this process's affinity)."""
        from services.serving.workers import default_workers

        if self.workers is None:
            return 1
        return self.workers or default_workers(cores)

    def config_text(self) -> str:
        """Its config file, as the node writes it (never a key: those stay in the environment)."""
        from services.base.config_options import config_text

        return config_text(self.config)

    def write_config(self, folder: Path) -> Path:
        """Its config file in `folder` (a node's folder of the attempt): `NAME.toml`."""
        from services.base.files import atomic_write_bytes

        path = folder / f"{self.name}.toml"
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, self.config_text().encode())
        return path

    def arguments(self, config_file: Path) -> list[str]:
        """Its `python -m services` arguments, but the workers (they depend on the node)."""
        return [self.service, "--config", str(config_file), "--log-level", self.log_level]

    def command_arguments(self, cores: int | None, config_file: Path) -> list[str]:
        """Its `python -m services` arguments, with `--workers` where it takes one."""
        if self.workers is None:
            return self.arguments(config_file)
        return [*self.arguments(config_file), "--workers", str(self.worker_count(cores))]


@dataclass(frozen=True)
class Checkpoint:
    """A model `deepdive eval` serves."""

    name: str  # as the table shows it
    path: Path
    kind: str  # hf (a Hugging Face folder) | step (a local training checkpoint)


@dataclass(frozen=True)
class EvalRollout:
    """What training's rollout plays with: its knobs, the episode's context and the response
    budget (the evaluation plays the same episodes)."""

    knobs: RolloutKnobs
    max_context_tokens: int
    max_response_tokens: int


class EvalEngine(Protocol):
    """How `deepdive eval` serves a backend's checkpoints behind SGLang's /generate."""

    description: str  # how --dry-run names it

    def resolve(self, spec: str) -> Checkpoint:
        """A --checkpoint (a path, or latest): what it is, or a ConfigError saying why not."""
        ...

    def check(self, checkpoint: Checkpoint) -> None:
        """Refuse, before anything starts, a checkpoint this engine cannot serve training's
        episodes with."""
        ...

    def serve(self, checkpoint: Checkpoint, logs: Path) -> AbstractContextManager[tuple[str, Any]]:
        """The checkpoint behind /generate: (its URL, the tokenizer the rollout uses, or None
        when the rollout loads it from args.hf_checkpoint)."""
        ...

    def rollout(self) -> EvalRollout: ...


class Backend(Protocol):
    name: str
    # whether node 0 starts the trainer with its Ray and services, before any is up (it then
    # waits for node 0's ready note before it connects to Ray, and for cluster.json), or only
    # once every node is ready
    starts_early: bool

    def check(self) -> list[str]:
        """Before submission: refuse what this backend cannot run (a ConfigError naming the
        key); the warnings, for the caller to print."""
        ...

    def check_continues(self, saved: ExperimentConfig) -> None:
        """The run folder was started with `saved` (same backend): a ConfigError when this
        config cannot continue it (its checkpoints would not load, or it is another run)."""
        ...

    def missing_inputs(self) -> list[str]:
        """What this backend reads that is not on disk yet, as "key: what is wrong"
        (slurm.launch.preflight lists them with the launcher's own)."""
        ...

    def input_paths(self) -> dict[str, str]:
        """What the job reads from the host's file systems, by key (slurm.launch.preflight checks
        that each is visible inside the image with the configured binds)."""
        ...

    def eval_engine(self) -> EvalEngine: ...

    def prepare(self) -> dict[str, Any]:
        """Node 0, before any service starts: write what the services read; a summary."""
        ...

    def services(self) -> list[ServiceSpec]: ...

    def environment(self, node_ip: str) -> dict[str, str]:
        """What every node's Ray (so every actor) and the trainer need in their environment."""
        ...

    def before_training(self, attempt: AttemptFolder) -> None:
        """Node 0, every node ready: write what the trainer reads (every node's URLs are in
        the attempt's cluster.json)."""
        ...

    def command(self, attempt: AttemptFolder) -> list[str]:
        """The training command line node 0 runs (a pure function of the config)."""
        ...

    def while_training(self) -> None:
        """Node 0, every few seconds while the trainer runs: the backend's housekeeping
        (slime: checkpoint retention); it must return at once."""
        ...

    def working_directory(self) -> str | None: ...

    def resume_point(self) -> str | None:
        """What the next attempt continues from, in words (None: it starts afresh)."""
        ...

    def checkpoint_step(self) -> int | None:
        """The step (slime: the rollout) of the newest complete checkpoint, read cheaply:
        `deepdive status` says what a requeue would redo."""
        ...

    def describe(self, attempt: AttemptFolder) -> str:
        """The training command as --dry-run prints it."""
        ...


def build_backend(config: ExperimentConfig) -> Backend:
    if config.run.backend == "slime":
        from slurm.backends.slime.backend import SlimeBackend

        return SlimeBackend(config)
    from slurm.backends.local import LocalBackend

    return LocalBackend(config)


def check_continues(config: ExperimentConfig, saved: ExperimentConfig, folder: Path) -> None:
    """`folder` holds a run started with `saved`: `config` continues it only with the same
    backend, and as that backend allows (`Backend.check_continues`)."""
    if saved.run.backend != config.run.backend:
        raise ConfigError(
            f"{folder} holds a {saved.run.backend} run: run.backend = "
            f"{config.run.backend!r} needs another run.folder"
        )
    build_backend(config).check_continues(saved)
