"""One self-contained HTML page of a run's episodes: the per-step statistics as inline SVG plots
and a filterable list of episodes that open to their turns. No network: the CSS and the script
are inline, so the page opens from a laptop's disk, a cluster's shared folder or an e-mail.

Everything the model wrote is escaped (a model in RL writes anything, `</script>` included); the
filter box takes the terms `--where` takes (reward=1 status=aborted tool=open, a bare word is
text=), checked on data attributes the page carries per episode."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from typing import Any

from deepdive.trajectory_format import EpisodeRecord, TurnRecord
from slurm.view.trajectories import (
    WHERE_KEYS,
    StepStats,
    reason_of,
    step_stats,
    tools_of,
    where_of,
)

PALETTE = [
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
.section>summary{cursor:pointer;font-weight:bold;margin:10px 0 6px}
.plots{display:flex;flex-wrap:wrap;gap:8px}
.plot{background:#fff;border:1px solid #ddd;border-radius:4px}
.plot text{font-size:11px;fill:#444}
#filter{width:32em;padding:4px;font:inherit}
.episode{background:#fff;border:1px solid #ddd;border-radius:4px;margin:4px 0;padding:2px 8px}
.episode>summary{cursor:pointer;padding:4px 0}
.reward1{color:#2a7a2a;font-weight:bold}.reward0{color:#a33;font-weight:bold}
.turn{border-left:3px solid #1f77b4;margin:8px 0;padding:2px 10px}
.turn pre,.meta pre{white-space:pre-wrap;word-break:break-word;margin:4px 0}
.call{color:#075;font-family:monospace}.bad{color:#b00}
.observation pre{background:#f3f3f3;padding:6px;max-height:30em;overflow:auto}
.muted{color:#777}
"""

# The filter: every term must match; KEY=VALUE on the episode's data attributes, a bare word
# (or text=...) anywhere in its text. The same rules as slurm.view.trajectories.Where.
SCRIPT = """
(function(){
  var box=document.getElementById('filter'), shown=document.getElementById('shown');
  var episodes=Array.prototype.slice.call(document.querySelectorAll('.episode'));
  function matches(e,term){
    var i=term.indexOf('='), key=i<0?'text':term.slice(0,i).toLowerCase();
    var value=(i<0?term:term.slice(i+1)).toLowerCase(), d=e.dataset;
    if(key==='reward')return parseFloat(d.reward)===parseFloat(value);
    if(key==='step')return parseFloat(d.step)===parseFloat(value);
    if(key==='status')return d.status===value;
    if(key==='tool')return (' '+d.tools+' ').indexOf(' '+value+' ')>=0;
    if(key==='checkpoint')return d.checkpoint===value;
    if(key==='id')return d.id===value;
    if(key==='text')return e.textContent.toLowerCase().indexOf(value)>=0;
    return false;
  }
  function apply(){
    var terms=box.value.trim().split(/\\s+/).filter(function(t){return t;}), n=0;
    episodes.forEach(function(e){
      var ok=terms.every(function(t){return matches(e,t);});
      e.hidden=!ok; if(ok)n++;
    });
    shown.textContent=n+' of '+episodes.length+' episodes';
  }
  box.addEventListener('input',apply); apply();
})();
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def line_chart(
    title: str, labels: Sequence[str], series: dict[str, list[float]], width: int = 280
) -> str:
    """An SVG line chart: one line per series over the labels (steps or checkpoints)."""
    per_row = 3  # legend entries per row under the axis
    rows = 0 if len(series) < 2 else -(-len(series) // per_row)
    height, left, right, top, bottom = 150 + 13 * rows, 42, 10, 24, 22 + 13 * rows
    values = [v for line in series.values() for v in line]
    low, high = min([0.0, *values]), max([0.0, *values])
    if high == low:
        high = low + 1.0
    span = max(1, len(labels) - 1)

    def x(i: int) -> float:
        return left + (width - left - right) * (i / span if len(labels) > 1 else 0.5)

    def y(v: float) -> float:
        return top + (height - top - bottom) * (1 - (v - low) / (high - low))

    parts = [
        f'<svg class="plot" width="{width}" height="{height}" role="img" aria-label="{_e(title)}">',
        f'<text x="{left}" y="15" style="font-weight:bold">{_e(title)}</text>',
        f'<line x1="{left}" y1="{y(low)}" x2="{width - right}" y2="{y(low)}" stroke="#999"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{y(low)}" stroke="#999"/>',
        f'<text x="{left - 4}" y="{y(high) + 4}" text-anchor="end">{high:.3g}</text>',
        f'<text x="{left - 4}" y="{y(low) + 4}" text-anchor="end">{low:.3g}</text>',
    ]
    ticks = sorted({0, len(labels) - 1, (len(labels) - 1) // 2})
    for i in ticks:
        anchor = "end" if i == len(labels) - 1 and i else "start" if i == 0 else "middle"
        parts.append(
            f'<text x="{x(i):.1f}" y="{height - bottom + 14}" text-anchor="{anchor}">'
            f"{_e(labels[i])}</text>"
        )
    for n, (name, line) in enumerate(series.items()):
        colour = PALETTE[n % len(PALETTE)]
        points = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(line))
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{points}"/>'
        )
        parts += [
            f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.5" fill="{colour}">'
            f"<title>{_e(name)} {_e(labels[i])}: {v:.3g}</title></circle>"
            for i, v in enumerate(line)
        ]
        if rows:
            lx = left + (width - left) // per_row * (n % per_row)
            ly = height - 6 - 13 * (rows - 1 - n // per_row)
            parts.append(f'<text x="{lx}" y="{ly}" style="fill:{colour}">{_e(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def plots(stats: Sequence[StepStats], recorded: Sequence[dict[str, Any]] = ()) -> str:
    """One set of charts per section (training's steps, each evaluation set, an eval's
    checkpoints: an x axis each), and the recorder's statistics over every episode of each step
    (stats.jsonl) where the run kept them."""
    sections: dict[str, list[StepStats]] = {}
    for row in stats:
        sections.setdefault(row.section, []).append(row)
    parts = []
    for evaluation in (False, True):
        kept = [r for r in recorded if bool(r.get("evaluation")) == evaluation]
        if kept:
            name = "evaluations" if evaluation else "training"
            parts.append((f"{name}: agent statistics over every episode", recorded_charts(kept)))
    for section, rows in sections.items():
        parts.append((f"{section}: the recorded episodes", _charts(rows)))
    if not parts:
        return '<p class="muted">no episodes</p>'
    # the first set open, the others one click away: the episodes stay near the top
    return "".join(
        f'<details class="section"{" open" if i == 0 else ""}><summary>{_e(title)}</summary>'
        f"{charts}</details>"
        for i, (title, charts) in enumerate(parts)
    )


def recorded_charts(rows: Sequence[dict[str, Any]]) -> str:
    """The recorder's statistics (deepdive.agent_stats), one chart per family of names:
    NAME/PART names share a chart (tool_calls/search, tool_calls/open ...), as do the rates
    and the token counts; any other number has a chart of its own."""
    labels = [str(row["step"]) for row in rows]
    families: dict[str, list[str]] = {}
    for row in rows:
        for key, value in row.items():
            if key in ("step", "evaluation") or not _is_number(value):
                continue
            family = (
                key.split("/", 1)[0]
                if "/" in key
                else "rates"
                if key.endswith("_rate")
                else "tokens"
                if key.endswith("_tokens")
                else key
            )
            if key not in families.setdefault(family, []):
                families[family].append(key)
    charts = []
    for family, keys in families.items():
        series = {_short(key, family): [float(row.get(key) or 0.0) for row in rows] for key in keys}
        charts.append(line_chart(family.replace("_", " "), labels, series))
    return '<div class="plots">' + "".join(charts) + "</div>"


def _short(key: str, family: str) -> str:
    """A series' name in its chart's legend: tool_calls/search is search, finish_rate finish."""
    if "/" in key:
        return key.split("/", 1)[1]
    if key == family:
        return "all" if family == "tool_calls" else key
    return key.removesuffix("_rate").removesuffix("_tokens")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _charts(stats: Sequence[StepStats]) -> str:
    labels = [s.x for s in stats]
    tools = sorted({name for s in stats for name in s.tool_calls})
    charts = [
        line_chart("reward (mean)", labels, {"reward": [s.reward for s in stats]}),
        line_chart(
            "tool calls per episode",
            labels,
            {t: [s.tool_calls.get(t, 0.0) for s in stats] for t in tools} or {"none": [0.0]},
        ),
        line_chart("turns per episode", labels, {"turns": [s.turns for s in stats]}),
        line_chart(
            "episode outcomes (share)",
            labels,
            {
                "finished": [s.finished for s in stats],
                "truncated": [s.truncated for s in stats],
                "aborted": [s.aborted for s in stats],
                "malformed": [s.malformed for s in stats],
            },
        ),
        line_chart("episodes", labels, {"episodes": [float(s.episodes) for s in stats]}),
    ]
    return '<div class="plots">' + "".join(charts) + "</div>"


def _turn(number: int, turn: TurnRecord) -> str:
    tokens = f" · {turn.tokens} tokens" if turn.tokens else ""
    parts = [f'<div class="turn"><div class="muted">turn {number}{tokens}</div>']
    parts.append(f"<pre>{_e(turn.text or '(no text)')}</pre>")
    if turn.call:
        arguments = json.dumps(turn.call.arguments, ensure_ascii=False, default=str)
        parts.append(f'<div class="call">→ {_e(turn.call.name)} {_e(arguments)}</div>')
    if turn.call_error:
        parts.append(f'<div class="bad">malformed call: {_e(turn.call_error)}</div>')
    if turn.tool_error:
        parts.append(f'<div class="bad">tool error: {_e(turn.tool_error)}</div>')
    if turn.observation is not None:
        text = turn.observation
        parts.append(
            f'<details class="observation"><summary>observation ({turn.observation_chars} '
            f"chars)</summary><pre>{_e(text)}</pre></details>"
        )
    parts.append("</div>")
    return "".join(parts)


def _episode(episode: EpisodeRecord) -> str:
    calls = tools_of(episode)
    tools = " ".join(sorted(calls))
    summary = " · ".join(
        [
            _e(where_of(episode)),
            _e(f"{episode.prompt_id} g{episode.group} #{episode.sample}"),
            f'<span class="{"reward1" if episode.reward > 0 else "reward0"}">reward '
            f"{episode.reward:g}</span>",
            _e(episode.status),
            f"{len(episode.turns)} turns",
            _e(" ".join(f"{k} {v}" for k, v in sorted(calls.items())) or "no calls"),
            _e(episode.question[:120]),
        ]
    )
    attributes = {
        "reward": f"{episode.reward:g}",
        "status": episode.status.lower(),
        "tools": tools,
        "step": str(episode.step),
        "checkpoint": (episode.checkpoint or "").lower(),
        "id": str(episode.prompt_id).lower(),
    }
    data = " ".join(f'data-{k}="{_e(v)}"' for k, v in attributes.items())
    meta = (
        f'<div class="meta"><pre><b>question</b> {_e(episode.question)}\n<b>label</b> '
        f"{_e(episode.label or '-')}   <b>answer</b> "
        f"{_e(episode.answer if episode.answer is not None else '-')}"
        + (f"\n<b>reason</b> {_e(reason_of(episode))}" if reason_of(episode) else "")
        + "</pre></div>"
    )
    turns = "".join(_turn(i, t) for i, t in enumerate(episode.turns, 1))
    return f'<details class="episode" {data}><summary>{summary}</summary>{meta}{turns}</details>'


def render_page(
    title: str,
    episodes: Sequence[EpisodeRecord],
    plotted: Sequence[EpisodeRecord],
    recorded: Sequence[dict[str, Any]] = (),
) -> str:
    """The page: plots over `plotted` (every episode of the run) and the `recorded` agent
    statistics, the list of `episodes` (those chosen by --step/--where)."""
    keys = ", ".join(f"{k}=" for k in WHERE_KEYS)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{_e(title)}</h1>{plots(step_stats(plotted), recorded)}"
        f'<h2>Episodes</h2><p><input id="filter" type="search" '
        f'placeholder="filter: {_e(keys)} or a word" aria-label="filter"> '
        f'<span id="shown"></span></p><div id="episodes">'
        + "".join(_episode(e) for e in episodes)
        + f"</div><script>{SCRIPT}</script></body></html>\n"
    )
