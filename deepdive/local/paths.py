"""The resume policy: when an existing run folder (deepdive/run_paths.py) may be continued."""

from __future__ import annotations

from typing import Any

from deepdive.local.checkpoint import load_latest
from deepdive.local.config import LocalRunConfig
from deepdive.run_paths import RunPaths
from services.base.errors import ConfigError

# What a resumed run may change; any other change makes it a different run. The rollout's
# timeouts, retries and abort and tool-error limits bound how services are waited for, not what is learnt.
RESUMABLE_KEYS = {
    "grpo.steps",
    "checkpoint.every",
    "checkpoint.keep",
    "run.resume",
    "run.threads",
    "rollout.tool_timeout_s",
    "rollout.reward_timeout_s",
    "rollout.generate_timeout_s",
    "rollout.retries",
    "rollout.max_aborted_share",
    "rollout.max_tool_error_share",
    "rollout.trajectory_groups",
    "rollout.trajectory_max_mb",
}
RESUMABLE_SECTIONS = {"eval"}


def config_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Keys whose values differ, except those a resumed run may change."""
    return [
        f"{section}.{key}"
        for section, values in current.items()
        if section not in RESUMABLE_SECTIONS
        for key, value in values.items()
        if f"{section}.{key}" not in RESUMABLE_KEYS and saved.get(section, {}).get(key) != value
    ]


def resume_point(
    config: LocalRunConfig, config_dict: dict[str, Any], paths: RunPaths
) -> tuple[int, dict[str, Any]] | None:
    """The newest checkpoint's step and state when this run may continue from it, None for a
    fresh run; a ConfigError when the folder holds another run or resuming is switched off."""
    latest = load_latest(paths.checkpoints)
    if latest is None:
        return None
    if not config.run.resume:
        raise ConfigError(
            f"run.resume = false, but {paths.checkpoints} holds checkpoints: choose "
            "another run.out, or delete that folder, to start over"
        )
    changed = config_changes(latest[1]["config"], config_dict)
    if changed:
        raise ConfigError(
            f"{paths.root} was started with another configuration ({', '.join(changed)} "
            "changed): a resumed run must be the same run; choose another run.out"
        )
    return latest
