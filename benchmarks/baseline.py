"""The baseline tree for side-by-side benchmarks: another commit of main in a second worktree.

Absolute times drift on a shared machine; a ratio of two commands measured in turn, pair by pair,
does not. The worktree is made once (.cache/baseline/REF, ignored by git) and reused; a REF that
is a folder already holding a checkout is used as it is. Both trees run on this checkout's
virtual environment.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from services.base.errors import RuntimeFailure

# main before issue 17 (the figures docs/benchmarks.md records were measured against it)
BASELINE_COMMIT = "c98b67c"
ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / ".cache" / "baseline"


class NoBaseline(RuntimeFailure):
    """The checkout cannot make the baseline tree (no git history, or the commit is missing)."""


def baseline_tree(ref: str = BASELINE_COMMIT) -> Path:
    """The checkout of `ref`: a folder holding one already, or a worktree made on first use."""
    given = Path(ref).expanduser()
    if (given / "services").is_dir():
        return given.resolve()
    tree = BASELINES / ref
    if (tree / "services").is_dir():
        return tree
    BASELINES.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), ref],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise NoBaseline(
            f"cannot make a worktree of {ref} for the side-by-side benchmarks "
            f"(a clone with its history is needed): {made.stderr.strip()}"
        )
    return tree


def has_workers_option(tree: Path) -> bool:
    """Whether the tree's tool server takes `--workers` (c98b67c's does not)."""
    command = tree / "services" / "tool_server" / "command.py"
    return command.is_file() and '"--workers"' in command.read_text()


def has_config_options(tree: Path) -> bool:
    """Whether the tree's tool server takes the options generated from its config dataclass
    (`--serper.base-url`; before: `--serper-url`)."""
    command = tree / "services" / "tool_server" / "command.py"
    return command.is_file() and "add_config_options" in command.read_text()
