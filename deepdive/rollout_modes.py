"""The rollouts of slime our hook cannot run under, refused where the refusal stops the run.

--partial-rollout and the fully-async rollout hand an aborted sample back to the hook to be
continued (slime/rollout/sglang_rollout.py, `abort`, lines 355-370;
slime/rollout/fully_async_rollout.py, lines 17-23 and 199-205) and keep the reward a sample
already has (`generate_and_rm`, lines 236-240): our hook restarts episodes, it cannot continue
them, so a restarted episode would train on a stale reward (DeepDive's hook refuses them too).

Where the refusal is raised decides whether it stops anything. slime loads the generate hook
lazily, per sample, inside `generate_and_rm` (sglang_rollout.py, lines 252-260). Under the
fully-async rollout that runs in a background worker thread, which logs a group's error and
drops it (fully_async_rollout.py, lines 141-145, 172-173 and 186-191), while the rollout waits
for groups that never come: the run hung until its time limit. So the refusal is made

- before submission (slurm/backends/slime/checks.py, with `fully_async` below);
- when slime builds its data source in RolloutManager.__init__ (slime/ray/rollout.py, lines
  383-384), where an error fails the actor and train.py with it: the launcher passes
  `--data-source-path deepdive.rollout_modes.checked_data_source`, which refuses, then builds
  slime's own data source. It also imports the rollout function as slime is about to (line
  386), so a wrapper that pulls in slime's fully-async module is caught whatever its name;
- per sample in the hook: fatal under slime's default rollout, where a group's error comes
  back through `task.result()` (sglang_rollout.py, line 416).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from deepdive.rollout_settings import GENERATE_FUNCTION_PATH
from services.base.errors import ConfigError

FULLY_ASYNC_MODULE = "slime.rollout.fully_async_rollout"
# --data-source-path: slime's default (slime/utils/arguments.py, lines 639-643), behind our check
DATA_SOURCE_PATH = "deepdive.rollout_modes.checked_data_source"
SLIME_DATA_SOURCE = "slime.rollout.data_source.RolloutDataSourceWithBuffer"


def fully_async(rollout_function_path: str) -> bool:
    """Whether a --rollout-function-path names the fully-async rollout: slime's
    (`slime.rollout.fully_async_rollout.generate_rollout_fully_async`) or one named after it."""
    return "fully_async" in rollout_function_path


def refuse_unsupported_modes(args: Any) -> None:
    """A ConfigError naming the flag when `args` would run a rollout that continues aborted
    episodes."""
    if getattr(args, "partial_rollout", False):
        raise ConfigError(
            f"--partial-rollout: {GENERATE_FUNCTION_PATH} cannot continue an aborted "
            "multi-turn episode; run without --partial-rollout"
        )
    path = getattr(args, "rollout_function_path", None) or ""
    if isinstance(path, str) and fully_async(path):
        raise ConfigError(
            f"--rollout-function-path {path}: {GENERATE_FUNCTION_PATH} cannot "
            "continue an aborted multi-turn episode (and slime's fully-async worker would only "
            "log this error, then wait forever); use slime's default rollout function"
        )


def refuse_fully_async_import(args: Any) -> None:
    """Import the module of --rollout-function-path, as slime does next (its `load_function`,
    slime/utils/misc.py, lines 39-48), and refuse it if that brought slime's fully-async
    rollout in: nothing else slime loads by then imports it."""
    path = getattr(args, "rollout_function_path", None) or ""
    module = path.rpartition(".")[0] if isinstance(path, str) else ""
    if not module:
        return
    importlib.import_module(module)
    if FULLY_ASYNC_MODULE in sys.modules:
        raise ConfigError(
            f"--rollout-function-path {path}: it runs slime's fully-async rollout "
            f"({FULLY_ASYNC_MODULE}), which hands aborted episodes back to be continued; "
            f"{GENERATE_FUNCTION_PATH} cannot continue them. Use slime's default "
            "rollout function"
        )


def checked_data_source(args: Any) -> Any:
    """--data-source-path: slime calls it with `args` in RolloutManager.__init__
    (slime/ray/rollout.py, lines 383-384), before any rollout. Refuses the rollouts the hook
    cannot run under, then returns slime's own default data source."""
    refuse_unsupported_modes(args)
    refuse_fully_async_import(args)
    module, _, name = SLIME_DATA_SOURCE.rpartition(".")
    return getattr(importlib.import_module(module), name)(args)
