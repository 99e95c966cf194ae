"""Episodes on the terminal (rich): a header per episode, one block per turn, the observation
folded to its first lines and its length unless asked for in full."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from slurm.trajectories import Episode, Turn, counted_calls

FOLDED_LINES = 3
FOLDED_CHARS = 240


def fold(observation: str, lines: int = FOLDED_LINES, chars: int = FOLDED_CHARS) -> str:
    """The observation's first lines (at most `chars` characters), and what was left out."""
    head = "\n".join(observation.splitlines()[:lines])[:chars]
    left = len(observation) - len(head)
    return head + (f"\n… {left} more characters" if left > 0 else "")


def header(episode: Episode) -> Text:
    calls = " ".join(f"{name} {n}" for name, n in sorted(counted_calls(episode).items()))
    colour = "green" if episode.reward > 0 else "red" if episode.status != "COMPLETED" else "yellow"
    text = Text()
    text.append(f"{episode.where} · {episode.id} #{episode.sample} · ")
    text.append(f"reward {episode.reward:g} · {episode.status}", style=f"bold {colour}")
    text.append(f" · {len(episode.turns)} turns" + (f" · {calls}" if calls else ""))
    return text


def turn_block(number: int, turn: Turn, unfold: bool) -> Panel:
    parts: list[Text] = [Text(turn.text or "(no text)")]
    if turn.tool:
        parts.append(Text(f"→ {turn.tool} {turn.arguments or {}}", style="cyan"))
    if turn.call_error:
        parts.append(Text(f"malformed call: {turn.call_error}", style="red"))
    if turn.observation is not None:
        shown = turn.observation if unfold else fold(turn.observation)
        parts.append(Text(f"observation ({turn.observation_chars} chars)", style="dim bold"))
        parts.append(Text(shown, style="dim"))
    return Panel(Group(*parts), title=f"turn {number}", title_align="left", border_style="blue")


def print_episodes(
    episodes: Sequence[Episode], console: Console, limit: int, unfold: bool = False
) -> None:
    for episode in episodes[:limit]:
        body: list[Text | Panel] = [
            Text.from_markup(f"[bold]question[/] {escape(episode.question)}"),
            Text.from_markup(
                f"[bold]label[/] {escape(episode.label)}   [bold]answer[/] "
                f"{escape(episode.answer if episode.answer is not None else '-')}"
            ),
        ]
        if episode.reason:
            body.append(Text.from_markup(f"[bold]reason[/] {escape(episode.reason)}"))
        body += [turn_block(i, turn, unfold) for i, turn in enumerate(episode.turns, 1)]
        console.print(Panel(Group(*body), title=header(episode), title_align="left"))
    shown = min(limit, len(episodes))
    console.print(f"{shown} of {len(episodes)} matching episode(s) shown", style="bold")
