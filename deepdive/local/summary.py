"""The end of a run on the terminal: what it reached, and where everything is."""

from __future__ import annotations

from typing import Any

from rich.console import Console


def print_summary(summary: dict[str, Any], console: Console) -> None:
    """The end of a run: what it reached, and where everything is."""
    from rich.table import Table

    def number(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    table = Table(title="deepdive run", show_header=False)
    warm = summary.get("warm_start") or {}
    rows = [
        (
            "warm start",
            f"{warm.get('steps', '-')} steps, final loss {number(warm.get('final_loss'))}",
        ),
        ("held-out reward after warm start", number(summary.get("eval_reward_before"))),
        ("held-out reward after GRPO", number(summary.get("eval_reward_after"))),
    ]
    if "unseen_reward_after" in summary:
        rows += [
            ("unseen-world reward after warm start", number(summary.get("unseen_reward_before"))),
            ("unseen-world reward after GRPO", number(summary.get("unseen_reward_after"))),
        ]
    rows += [
        ("training reward, first step", number(summary.get("train_reward_first"))),
        ("training reward, last 5 steps", number(summary.get("train_reward_last5"))),
        ("GRPO steps per minute", number(summary.get("steps_per_minute"))),
        (
            "rollout / update / sync s",
            " / ".join(number(v) for v in (summary.get("time_split_s") or {}).values()),
        ),
        ("wall time", f"{summary.get('wall_s')} s"),
    ]
    rows += [(name, path) for name, path in (summary.get("paths") or {}).items()]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    run = (summary.get("paths") or {}).get("run")
    if run:  # the viewer is the launcher's (slurm/view/trajectories.py): named here, not imported
        console.print(f"episodes on the terminal: deepdive trajectories {run} --last")
        console.print(f"the report: {report_command(run)}", soft_wrap=True)


def report_command(run: str) -> str:
    """The command that writes a run's report (its episodes and agent statistics) and opens it."""
    page = f"{run}/report.html"
    return f"deepdive trajectories {run} --html {page} && xdg-open {page}"
