"""The baseline tree for side-by-side benchmarks: main at BASELINE_COMMIT in a second worktree.

Absolute times drift on a shared machine; a ratio of two commands measured in turn, pair by pair,
does not. The worktree is made once (.cache/baseline/COMMIT, ignored by git) and reused;
both trees run on this checkout's virtual environment.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

# main before issue 17 (the figures the issue quotes were measured against it)
BASELINE_COMMIT = "c98b67c"
ROOT = Path(__file__).resolve().parent.parent
BASELINES = ROOT / ".cache" / "baseline"


class NoBaseline(RuntimeError):
    """The checkout cannot make the baseline tree (no git history, or the commit is missing)."""


def baseline_tree(commit: str = BASELINE_COMMIT) -> Path:
    """The worktree of `commit`, made on first use."""
    tree = BASELINES / commit
    if (tree / "services").is_dir():
        return tree
    BASELINES.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), commit],
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise NoBaseline(
            f"cannot make a worktree of {commit} for the side-by-side benchmarks "
            f"(a clone with its history is needed): {made.stderr.strip()}"
        )
    return tree
