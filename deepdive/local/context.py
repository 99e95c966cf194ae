"""What every stage of a local run shares: the config, the run folder, and how it reports to the
person watching (one line per event off a terminal, progress bars on one)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from deepdive.local.config import LocalRunConfig
from deepdive.run_paths import RunPaths


@dataclass
class RunContext:
    config: LocalRunConfig
    paths: RunPaths
    console: Console
    on_event: Callable[[str], None] | None = None  # milestones, for a launcher watching the run
    config_dict: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.config_dict = dataclasses.asdict(self.config)

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def event(self, name: str) -> None:
        if self.on_event is not None:
            self.on_event(name)

    def progress(self) -> Progress:
        return Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.console.is_terminal,
        )
