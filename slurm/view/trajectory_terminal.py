"""Episodes on the terminal (rich): a header per episode, one block per turn, the observation
folded to its first lines and its length unless asked for in full."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text

from deepdive.trajectory_format import EpisodeRecord, TurnRecord
from slurm.view.trajectories import reason_of, tools_of, where_of

FOLDED_LINES = 3
FOLDED_CHARS = 240


def fold(observation: str, lines: int = FOLDED_LINES, chars: int = FOLDED_CHARS) -> str:
    """The observation's first lines (at most `chars` characters), and what was left out."""
    observation = observation.strip()
    head = "\n".join(observation.splitlines()[:lines])[:chars]
    left = len(observation) - len(head)
    return head + (f"\n… {left} more characters" if left > 0 else "")


def header(episode: EpisodeRecord) -> Text:
    calls = " ".join(f"{name} {n}" for name, n in sorted(tools_of(episode).items()))
    colour = "green" if episode.reward > 0 else "red" if episode.status != "completed" else "yellow"
    text = Text()
    text.append(f"{where_of(episode)} · {episode.prompt_id} g{episode.group} #{episode.sample} · ")
    text.append(f"reward {episode.reward:g} · {episode.status}", style=f"bold {colour}")
    text.append(f" · {len(episode.turns)} turns" + (f" · {calls}" if calls else ""))
    return text


def turn_block(number: int, turn: TurnRecord, unfold: bool) -> Panel:
    parts: list[Text] = [Text(turn.text or "(no text)")]
    if turn.call:
        parts.append(Text(f"→ {turn.call.name} {turn.call.arguments}", style="cyan"))
    if turn.call_error:
        parts.append(Text(f"malformed call: {turn.call_error}", style="red"))
    if turn.tool_error:
        parts.append(Text(f"tool error: {turn.tool_error}", style="red"))
    if turn.observation is not None:
        shown = turn.observation if unfold else fold(turn.observation)
        parts.append(Text(f"observation ({turn.observation_chars} chars)", style="dim bold"))
        # the record keeps at most OBSERVATION_CHARS of it; observation_chars is its full length
        parts.append(Text(shown, style="dim"))
    return Panel(Group(*parts), title=f"turn {number}", title_align="left", border_style="blue")


def print_episodes(
    episodes: Sequence[EpisodeRecord], console: Console, limit: int, unfold: bool = False
) -> None:
    for episode in episodes[:limit]:
        body: list[Text | Panel] = [
            Text.from_markup(f"[bold]question[/] {escape(episode.question)}"),
            Text.from_markup(
                f"[bold]label[/] {escape(episode.label or '-')}   [bold]answer[/] "
                f"{escape(episode.answer if episode.answer is not None else '-')}"
            ),
        ]
        reason = reason_of(episode)
        if reason:
            body.append(Text.from_markup(f"[bold]reason[/] {escape(reason)}"))
        body += [turn_block(i, turn, unfold) for i, turn in enumerate(episode.turns, 1)]
        console.print(Panel(Group(*body), title=header(episode), title_align="left"))
    shown = min(limit, len(episodes))
    console.print(f"{shown} of {len(episodes)} matching episode(s) shown", style="bold")
