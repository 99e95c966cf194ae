"""Step 1: the image, as the normal user a Slurm job runs as.

- the GPUs: torch.cuda.device_count() equals what Slurm gave the task (and
  slurm.gpus_per_node); zero is a failure, never a pass;
- the driver: nvidia-smi answers and lists the node's GPUs;
- the CPUs: the task's affinity holds at least the CPUs it asked for (slurm.cpus_per_task):
  Slurm 22.05-23.02 under core binding gives a step without srun --cpus-per-task one core;
- the host memory: the node's (MemTotal, or the cgroup's limit when lower) holds the slime
  experiment's host estimate (CPU Adam, slime's weight backups; memory_estimate.host_estimate);
- the import closure of slime's training path and our hooks (IMPORT_CLOSURE): each module
  imported, each named function present, versions printed;
- the user: not root (Apptainer runs the job as the submitting user, so a check as root
  proves nothing about what that user can read);
- the files: slime, Megatron-LM and our package readable by any user, every folder above
  them traversable (slime's own image keeps them in /root, which a normal user cannot enter);
- a real search: one search and one read from this node through a tool server of the
  experiment's [services.tools], its keys and its proxy (slurm/smoke/search.py); skipped for
  the offline world.

The search is a check of this step, not a step of its own: like the others here it needs no
GPU and takes seconds on every node, and a step's checks all run, so a refused key is reported
beside a missing GPU in the same run instead of behind the first failed step.
"""

from __future__ import annotations

import importlib
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from deepdive.rollout_settings import GENERATE_FUNCTION_PATH, REWARD_FUNCTION_PATH
from slurm.backends.slime.args import DYNAMIC_FILTERS, FILTERS
from slurm.config import ExperimentConfig
from slurm.node.environment import CpuGrant, GpuGrant, cpus_given, gpus_given
from slurm.smoke.context import SmokeContext
from slurm.smoke.gpus import NoDriver, nvidia_smi, torch_gpus
from slurm.smoke.report import Check, failed, passed
from slurm.smoke.search import search_check


@dataclass(frozen=True)
class Needed:
    module: str
    attribute: str  # "" = the module alone
    why: str

    @classmethod
    def at(cls, path: str, why: str) -> Needed:
        """The function at a dotted path, split at its last dot as slime's `load_function`
        splits our hook paths (slime/utils/misc.py:39-47), so the check names what slime loads."""
        module, _, attribute = path.rpartition(".")
        return cls(module, attribute, why)

    @property
    def name(self) -> str:
        return f"{self.module}.{self.attribute}" if self.attribute else self.module


# What a slime training job imports before it learns anything (the names at slime 624b824).
IMPORT_CLOSURE = (
    Needed("torch", "", "PyTorch with CUDA"),
    Needed(
        "slime.ray.placement_group",
        "create_placement_groups",
        "train.py places its actors with it (slime/ray/placement_group.py:120)",
    ),
    Needed(
        "slime.rollout.sglang_rollout",
        "generate_rollout",
        "slime's rollout, which awaits our hook (slime/rollout/sglang_rollout.py:627); "
        "it imports rm_hub, which imports pylatexenc",
    ),
    Needed(
        "slime.backends.megatron_utils.model_provider",
        "get_model_provider_func",
        "builds the Megatron model (slime/backends/megatron_utils/model_provider.py:265)",
    ),
    Needed("megatron.core", "", "Megatron-LM with slime's patch"),
    Needed("transformer_engine.pytorch", "", "Megatron's default layer spec"),
    Needed(
        "fused_weight_gradient_mlp_cuda",
        "",
        "apex's fused CUDA extension: Megatron's gradient-accumulation fusion in its "
        "linear layers, the output layer's included",
    ),
    Needed(
        "torch_memory_saver",
        "",
        "slime's offload and SGLang's memory release (slime/backends/megatron_utils/actor.py:12)",
    ),
    Needed("sglang", "", "the rollout engine"),
    Needed(
        "sglang_router.launch_router",
        "RouterArgs",
        "slime starts its router with it (slime/backends/sglang_utils/arguments.py:5)",
    ),
    Needed("wandb", "", "imported by slime's logging (slime/observability/logging_utils.py:3)"),
    Needed("pylatexenc", "", "slime's math reward helpers (slime/rollout/rm_hub/math_utils.py:10)"),
    Needed("ray", "", "slime's actors"),
    Needed.at(GENERATE_FUNCTION_PATH, "our --custom-generate-function-path"),
    Needed.at(REWARD_FUNCTION_PATH, "our --custom-rm-path"),
    *(
        Needed(FILTERS, name, "our --dynamic-sampling-filter-path")
        for name in sorted(set(DYNAMIC_FILTERS.values()))
    ),
)
# packages whose files the job's user must be able to read, wherever they are installed
READ_PACKAGES = ("slime", "megatron", "deepdive")
LISTED = 5  # unreadable paths named in a failure; the rest are counted


def run(context: SmokeContext) -> list[Check]:
    count, build = torch_gpus()
    configured = context.config.slurm.gpus_per_node
    checks = [gpu_check(count, build, gpus_given(), configured, _driver_count()), driver_check()]
    checks.append(cpu_check(cpus_given(), context.config.slurm.cpus_per_task))
    checks.append(host_memory_check(context.config, node_memory_gib()))
    checks += import_checks(IMPORT_CLOSURE)
    checks.append(user_check(os.geteuid()))
    slime = context.config.slime
    roots = [Path("/opt"), Path(slime.slime_root), *map(Path, slime.python_path)]
    checks.append(readable_check(roots, package_folders(READ_PACKAGES)))
    checks.append(search_check(context))
    return checks


def driver_check() -> Check:
    try:
        gpus = nvidia_smi()
    except NoDriver as error:
        return failed("driver", str(error))
    if not gpus:
        return failed("driver", "nvidia-smi lists no GPU on this node")
    names = sorted({gpu.name for gpu in gpus})
    return passed(
        "driver",
        f"driver {gpus[0].driver}, {len(gpus)} GPU(s): {', '.join(names)}",
    )


def _driver_count() -> int | None:
    try:
        return len(nvidia_smi())
    except NoDriver:
        return None


def gpu_check(
    torch_count: int, build: str, grant: GpuGrant, configured: int, driver_count: int | None
) -> Check:
    """torch's GPU count against what Slurm gave the task (and what the experiment asks for)."""
    given = grant.describe()
    driver = "" if driver_count is None else f"; the driver shows {driver_count}"
    if torch_count == 0:
        return failed(
            "GPUs",
            f"no GPU: torch.cuda.device_count() is 0 ({build}); Slurm gave: {given}{driver}",
        )
    expected = grant.count
    if expected is None and grant.in_job:
        return failed(
            "GPUs",
            f"Slurm gave this task no GPU ({given}) but torch sees {torch_count}: ask for "
            "them (slurm.gpus_per_node), or the job may use GPUs another job was given",
        )
    if expected is not None and expected != torch_count:
        return failed(
            "GPUs", f"torch sees {torch_count} GPU(s) but Slurm gave {expected} ({given}{driver})"
        )
    if configured and configured != torch_count:
        return failed(
            "GPUs", f"slurm.gpus_per_node is {configured} but torch sees {torch_count} ({given})"
        )
    if expected is None and driver_count is not None and driver_count != torch_count:
        return failed("GPUs", f"torch sees {torch_count} GPU(s), the driver {driver_count}")
    return passed("GPUs", f"torch sees {torch_count}, as given ({given}); {build}")


def cpu_check(grant: CpuGrant, configured: int) -> Check:
    """The CPUs the task may run on (its affinity) against what it asked for: the experiment's
    slurm.cpus_per_task, else what Slurm says it gave."""
    asked = configured or grant.slurm
    if asked and grant.affinity < asked:
        return failed(
            "CPUs",
            f"the task's affinity holds {grant.affinity} CPU(s), {asked} asked "
            f"(slurm.cpus_per_task = {configured}, Slurm says {grant.slurm or 'nothing'}): "
            "srun without --cpus-per-task under core binding (Slurm 22.05-23.02), or the "
            "site binds fewer",
        )
    if not asked:
        return passed("CPUs", f"{grant.affinity} in the task's affinity; none asked")
    return passed("CPUs", f"{grant.affinity} in the task's affinity, {asked} asked")


def node_memory_gib() -> float:
    """This node's memory as the task may use it: MemTotal, or the cgroup's limit when lower
    (v2 memory.max, v1 memory.limit_in_bytes)."""
    sizes = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                sizes.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            sizes.append(int(text))
    return min(sizes) / 2**30 if sizes else 0.0


def host_memory_check(config: ExperimentConfig, node_gib: float) -> Check:
    """The node's memory against the experiment's host estimate (a slime experiment whose
    model's config.json is readable here; otherwise the figure alone)."""
    from slurm.backends.slime.memory_estimate import host_estimate
    from slurm.backends.slime.model_context import read_config

    if node_gib <= 0:
        return failed("host memory", "neither /proc/meminfo nor the cgroup says")
    model = Path(config.slime.model.hf_checkpoint) / "config.json"
    if not config.slime.model.hf_checkpoint or not model.is_file():
        return passed("host memory", f"{node_gib:.0f} GiB on this node (no model to estimate)")
    found = host_estimate(config, read_config(model.parent), node_gib)
    if found is None:
        return passed("host memory", f"{node_gib:.0f} GiB on this node (model not estimated)")
    detail = f"about {found.total_gib:.0f} GiB needed, {node_gib:.0f} GiB on this node"
    if not found.fits():
        return failed("host memory", f"{detail}:\n{found.describe()}")
    return passed("host memory", detail)


def import_checks(needed: tuple[Needed, ...]) -> list[Check]:
    """One check per module or function of the closure: imported, or why not."""
    checks = []
    for item in needed:
        try:
            module = importlib.import_module(item.module)
        except Exception as error:  # an extension can fail with OSError, RuntimeError, ...
            detail = f"{type(error).__name__}: {error} (needed: {item.why})"
            checks.append(failed(f"import {item.name}", detail))
            continue
        if item.attribute and not hasattr(module, item.attribute):
            detail = f"{item.module} ({module.__file__}) has no {item.attribute} ({item.why})"
            checks.append(failed(f"import {item.name}", detail))
            continue
        version = getattr(module, "__version__", None)
        where = f"{version} " if isinstance(version, str) else ""
        checks.append(passed(f"import {item.name}", f"{where}{module.__file__}"))
    return checks


def user_check(uid: int) -> Check:
    if uid == 0:
        return failed(
            "user",
            "running as root (uid 0): the check must run as the normal user a Slurm job runs "
            "as (Apptainer keeps the submitting user's uid); root reads every file",
        )
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = "no passwd entry"
    return passed("user", f"uid {uid} ({name}), not root")


def package_folders(names: tuple[str, ...]) -> list[Path]:
    """Where each package that imports is installed (its folder)."""
    folders = []
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: S112 (a missing one is named by the import checks)
            continue
        for path in getattr(module, "__path__", []):
            folders.append(Path(path))
    return folders


def readable_check(roots: list[Path], trees: list[Path]) -> Check:
    """`roots` (the folder alone) and `trees` (every file under them) readable by any user,
    every folder above them traversable."""
    problems: list[str] = []
    checked = 0
    for root in roots:
        problems += _reachable(root)
        if root.exists() and root not in trees:
            checked += 1
            problems += _mode_problems(root)
    for tree in trees:
        problems += _reachable(tree)
        for path in _walk(tree, problems):
            checked += 1
            problems += _mode_problems(path)
    problems = list(dict.fromkeys(problems))
    if problems:
        shown = "; ".join(problems[:LISTED])
        more = f" (and {len(problems) - LISTED} more)" if len(problems) > LISTED else ""
        return failed("files readable by a normal user", f"{shown}{more}")
    where = ", ".join(str(path) for path in [*roots, *trees])
    return passed("files readable by a normal user", f"{checked} paths under {where}")


def _reachable(path: Path) -> list[str]:
    if not path.exists():
        return [f"{path} does not exist"]
    problems = []
    for parent in reversed(path.absolute().parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            problems.append(f"{parent} is not traversable by other users (mode {mode & 0o777:o})")
    return problems


def _walk(tree: Path, problems: list[str]) -> list[Path]:
    found = [tree]
    for folder, folders, files in os.walk(tree, onerror=lambda e: problems.append(str(e))):
        found += [Path(folder, name) for name in (*folders, *files)]
    return found


def _mode_problems(path: Path) -> list[str]:
    try:
        mode = path.stat().st_mode
    except OSError as error:  # a dangling link: nothing to read
        return [] if path.is_symlink() else [f"{path}: {error}"]
    wanted = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    if mode & wanted != wanted or not os.access(path, os.R_OK):
        return [f"{path} is not readable by other users (mode {mode & 0o777:o})"]
    return []
