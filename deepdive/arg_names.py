"""The names of the rollout's settings: the `deepdive_*` attribute of slime's `args` (and key of
the custom-config YAML) and the environment variable each falls back to. Apart from
deepdive.rollout_settings so that deepdive.service_urls, which names the URL keys in its
errors, and the knobs share one spelling without importing each other.
"""

from __future__ import annotations

__all__ = ["PREFIX", "arg_name", "env_name"]

PREFIX = "deepdive_"


def arg_name(field: str) -> str:
    """The attribute of slime's `args` (and key of the custom-config YAML) for one setting."""
    return PREFIX + field


def env_name(key: str) -> str:
    """The environment variable a setting falls back to: max_turns -> DEEPDIVE_MAX_TURNS."""
    return "DEEPDIVE_" + key.removeprefix(PREFIX).upper()
