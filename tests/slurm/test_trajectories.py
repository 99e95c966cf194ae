"""`deepdive trajectories`: episodes read from what `deepdive eval` writes, filtered as asked,
printed turn by turn, and written as one self-contained page that a real browser renders,
filters and opens (Chromium through chromium-driver; skipped, saying why, without them)."""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from deepdive.agent_stats import agent_statistics
from deepdive.local.summary import print_summary
from deepdive.protocol import find_tool_calls, format_observation, format_tool_call
from deepdive.sample import LocalSample, SampleStatus
from deepdive.trajectory_format import (
    EpisodeRecord,
    Status,
    ToolCallRecord,
    TurnRecord,
    write_step,
)
from deepdive.trajectory_recorder import record_step
from services.base.errors import ConfigError
from slurm.launch.eval_report import episode_row
from slurm.view.trajectories import (
    Where,
    load_episodes,
    read_stats,
    select,
    split_turns,
    step_stats,
    where_of,
)
from slurm.view.trajectory_page import render_page
from slurm.view.trajectory_terminal import print_episodes
from tests.browser import ELEMENT, Browser, headless_chromium, missing_browser
from tests.hostile import json_values, model_turns, tool_names, unicode_text

DEEPDIVE = [sys.executable, "-m", "slurm.cli", "trajectories"]
# DEEPDIVE_SCREENSHOT=docs/trajectories.png: the browser test keeps its screenshot there
SCREENSHOT = os.environ.get("DEEPDIVE_SCREENSHOT")

# Episodes written by the code that writes them in a real eval (slurm/launch/eval_report.py's
# `episode_row` over the rollout's Sample), in the rollout's own syntax.
HOSTILE = '</script><script>alert(1)</script> <img src=x onerror=alert(2)> & "quoted"'


def _call(name: str, **arguments: Any) -> str:
    return format_tool_call(name, arguments)


def played(turns: list[tuple[str, str | None]]) -> tuple[str, list[dict[str, Any]]]:
    """A response as the rollout builds it from (model text, observation) turns, and its turn
    log (deepdive/episode.py's `turn_log`: each turn's text and observation lengths, the call
    the protocol parsed or why it did not), which the recorder cuts the response by."""
    response, log = "", []
    for text, observation in turns:
        entry: dict[str, Any] = {"chars": len(text), "tokens": 9}
        calls = find_tool_calls(text)
        if calls and calls[-1].call:
            entry["call"] = [calls[-1].call.name, dict(calls[-1].call.arguments)]
        elif calls:
            entry["call_error"] = str(calls[-1].error)
        response += text
        if observation is not None:
            seen = format_observation(observation)
            entry["obs_chars"] = len(seen)
            response += seen
        log.append(entry)
    return response, log


LONG_PAGE = "Glass harbour, population 4,100. " * 40


def trajectories() -> list[tuple[str, str, list[tuple[str, str | None]], float, SampleStatus, str]]:
    """(id, question, turns, reward, status, label) for a small eval."""
    return [
        (
            "q-search-open",
            "Which harbour did the Amber Line sail from?",
            [
                (
                    "I should search." + _call("search", query="Amber Line harbour"),
                    "[1] Amber Line - the ferry from Glass Harbour",
                ),
                (
                    "Open the first." + _call("open", url="https://offline.example/amber-line"),
                    LONG_PAGE,
                ),
                (_call("finish", answer="Glass Harbour"), None),
            ],
            1.0,
            SampleStatus.COMPLETED,
            "Glass Harbour",
        ),
        (
            "q-wrong",
            "Who founded the Copper Archive?",
            [
                (_call("search", query="Copper Archive founder"), "No results found."),
                (_call("finish", answer="Nobody"), None),
            ],
            0.0,
            SampleStatus.COMPLETED,
            "Ida Brandt",
        ),
        (
            "q-aborted",
            "When did the Salt Bridge open?",
            [("Let me look." + _call("search", query="Salt Bridge opening"), None)],
            0.0,
            SampleStatus.ABORTED,
            "1911",
        ),
        (
            "q-hostile",
            f"What does {HOSTILE} mean?",
            [(f"{HOSTILE} <tool_call>{{not json</tool_call>", None)],
            0.0,
            SampleStatus.TRUNCATED,
            "nothing",
        ),
    ]


def write_eval_folder(folder: Path, checkpoints: tuple[str, ...] = ("base", "step_4")) -> Path:
    """An eval output folder: each trajectory under each checkpoint, in results.jsonl as
    `deepdive eval` writes it (slurm/launch/eval_report.py's `episode_row`)."""
    rows = []
    for checkpoint in checkpoints:
        for index, (qid, question, turns, reward, status, label) in enumerate(trajectories()):
            row = {
                "id": qid,
                "label": label,
                "input_messages": [{"role": "user", "content": question}],
            }
            response, log = played(turns)
            sample = LocalSample(
                index=index,
                response=response,
                reward=reward,
                status=status,
                metadata={
                    "deepdive": {"turns": len(log), "turn_log": log},
                    "reward_details": {"extracted_answer": "Glass Harbour" if reward else None},
                },
            )
            rows.append(episode_row(checkpoint, row, sample, group_size=1))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return folder


def _record(
    step: int, group: int, qid: str, turns: list[TurnRecord], reward: float, status: Status
) -> EpisodeRecord:
    return EpisodeRecord(
        step=step,
        group=group,
        sample=0,
        question=f"Question {qid}?",
        label="Glass Harbour",
        turns=tuple(turns),
        answer="Glass Harbour" if reward else None,
        reward=reward,
        status=status,
        judge_reason="correct" if reward else "wrong answer",
        prompt_id=qid,
    )


def _turn(name: str, observation: str | None, **arguments: Any) -> TurnRecord:
    return TurnRecord(
        text=_call(name, **arguments),
        tokens=12,
        call=ToolCallRecord(name, arguments),
        observation=observation,
        observation_chars=len(observation or ""),
    )


def write_run_folder(folder: Path, steps: int = 3) -> Path:
    """A run folder as training leaves it: one step file per step (the format's own writer),
    more searches and more reward as the steps go."""
    for step in range(1, steps + 1):
        records = []
        for group in range(4):
            searches = [_turn("search", "[1] a result", query=f"q{i}") for i in range(step)]
            won = group < step
            finish = _turn("finish", None, answer="Glass Harbour" if won else "no")
            status: Status = "completed" if group < 3 else "aborted"
            records.append(
                _record(step, group, f"s{step}g{group}", [*searches, finish], float(won), status)
            )
        write_step(folder / "trajectories", step, records)
    return folder


def _played(group: int, searches: int, won: bool, status: SampleStatus) -> LocalSample:
    """A training sample as the rollout leaves it: `searches` searches, then finish."""
    answer = "Glass Harbour" if won else "no"
    response, log = played(
        [(_call("search", query=f"q{i}"), f"[1] result {i}") for i in range(searches)]
        + [(_call("finish", answer=answer), None)]
    )
    return LocalSample(
        group_index=group,
        index=group,
        prompt=[{"role": "user", "content": f"Question {group}?"}],
        response=response,
        response_length=len(response),
        label="Glass Harbour",
        reward=1.0 if won else 0.0,
        status=status,
        metadata={
            "id": f"p{group}",
            "deepdive": {
                "turns": len(log),
                "tool_calls": {"search": searches, "finish": 1},
                "turn_log": log,
            },
            "reward_details": {"extracted_answer": answer},
        },
    )


def write_recorded_run(folder: Path, steps: int = 3) -> Path:
    """A run folder as the rollout log functions leave it: each step's samples through the
    recorder (deepdive.trajectory_recorder) with their agent statistics (deepdive.agent_stats),
    and an evaluation at the last step."""
    recorder = None
    for step in range(1, steps + 1):
        samples = [_played(group, step, group < step, SampleStatus.COMPLETED) for group in range(4)]
        recorder = record_step(
            folder / "trajectories",
            step,
            samples,
            groups=None,
            max_bytes=1 << 30,
            stats=agent_statistics(samples),
        )
    held_out = [_played(g, 1, g == 0, SampleStatus.TRUNCATED) for g in range(2)]
    recorder = record_step(
        folder / "trajectories",
        steps,
        {"held-out": held_out},
        groups=None,
        max_bytes=1 << 30,
        evaluation=True,
        stats=agent_statistics(held_out),
    )
    assert recorder is not None
    recorder.flush()
    return folder


def deepdive(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEEPDIVE, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_an_eval_folder_reads_into_turns(tmp_path: Path) -> None:
    episodes = load_episodes(write_eval_folder(tmp_path / "eval"))
    assert len(episodes) == 8
    first = episodes[0]
    assert [t.call.name if t.call else None for t in first.turns] == ["search", "open", "finish"]
    assert first.turns[1].observation_chars == len(format_observation(LONG_PAGE))
    assert first.step == 0 and episodes[4].step == 4  # the step in the checkpoint's name
    assert first.turns[2].observation is None
    hostile = next(e for e in episodes if e.prompt_id == "q-hostile")
    assert hostile.turns[0].call_error and hostile.status == "truncated"


def test_a_run_folder_reads_its_evals(tmp_path: Path) -> None:
    write_eval_folder(tmp_path / "run" / "eval" / "20261204-010203", ("final",))
    assert {e.checkpoint for e in load_episodes(tmp_path / "run")} == {"final"}


def test_a_run_folder_reads_its_recorded_steps(tmp_path: Path) -> None:
    run = write_run_folder(tmp_path / "run")
    episodes = load_episodes(run)
    assert sorted({e.step for e in episodes}) == [1, 2, 3] and len(episodes) == 12
    assert load_episodes(run / "trajectories") == episodes
    assert {e.step for e in select(episodes, last=True)} == {3}
    assert {e.prompt_id for e in select(episodes, step=2)} == {f"s2g{g}" for g in range(4)}
    stats = step_stats(episodes)
    assert [s.where for s in stats] == ["step 1", "step 2", "step 3"]
    assert [s.reward for s in stats] == [0.25, 0.5, 0.75]
    assert [s.tool_calls["search"] for s in stats] == [1.0, 2.0, 3.0]
    assert [s.aborted for s in stats] == [0.25] * 3


def test_a_run_the_recorder_wrote_reads_with_its_statistics(tmp_path: Path) -> None:
    run = write_recorded_run(tmp_path / "run")
    episodes = load_episodes(run)
    assert len(episodes) == 14
    evaluation = [e for e in episodes if e.evaluation]
    assert {where_of(e) for e in evaluation} == {"eval step 3 (held-out)"}
    newest = select(episodes, last=True)
    assert {where_of(e) for e in newest} == {"step 3", "eval step 3 (held-out)"}
    searched = select(episodes, [Where.parse("step=2"), Where.parse("reward=1")])
    assert [[t.call.name if t.call else None for t in e.turns] for e in searched] == [
        ["search", "search", "finish"]
    ] * 2
    assert "[1] result 0" in (searched[0].turns[0].observation or "")
    stats = read_stats(run)
    assert [(row["step"], row["evaluation"]) for row in stats] == [
        (1, False),
        (2, False),
        (3, False),
        (3, True),
    ]
    assert [row["tool_calls/search"] for row in stats[:3]] == [1.0, 2.0, 3.0]
    page = render_page("run", episodes, episodes, stats)
    assert "training: agent statistics over every episode" in page
    assert "evaluation (held-out): the recorded episodes" in page
    assert 'aria-label="tool calls"' in page and 'aria-label="rates"' in page


def test_a_statistics_line_cut_by_a_crash_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "stats.jsonl").write_text('{"step": 1, "turns": 2}\n{"step": 2, "tu')
    assert read_stats(tmp_path) == [{"step": 1, "turns": 2}]
    (tmp_path / "stats.jsonl").write_text('{"step": "one"}\n{"step": 2}\n')
    with pytest.raises(ConfigError, match=r"stats.jsonl, line 1: expected an object"):
        read_stats(tmp_path)


def test_an_old_eval_row_still_reads(tmp_path: Path) -> None:
    """results.jsonl as `deepdive eval` wrote it before the recorded format (one text)."""
    row = {
        "checkpoint": "base",
        "id": "q1",
        "sample": 0,
        "question": "Where?",
        "label": "Here",
        "answer": None,
        "reward": 0.0,
        "status": "ABORTED",
        "turns": 1,
        "tool_calls": {"search": 1},
        "error": "sglang: 503",
        "trajectory": _call("search", query="where") + format_observation("[1] here"),
    }
    (tmp_path / "results.jsonl").write_bytes(orjson.dumps(row) + b"\n")
    (episode,) = load_episodes(tmp_path)
    assert (episode.checkpoint, episode.status, episode.error) == ("base", "aborted", "sglang: 503")
    assert episode.turns[0].call == ToolCallRecord("search", {"query": "where", "num": None})
    assert episode.turns[0].observation == "[1] here"


def test_a_folder_without_episodes_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no episodes here"):
        load_episodes(tmp_path)
    (tmp_path / "results.jsonl").write_text('{"id": 1, "status": "aborted"}\n[1]\n')
    with pytest.raises(ConfigError, match=r"results.jsonl, line 2: expected a JSON object"):
        load_episodes(tmp_path)
    (tmp_path / "results.jsonl").write_text('{"format": "deepdive.episode", "version": 9}\n')
    with pytest.raises(ConfigError, match=r"results.jsonl, line 1: field 'version'"):
        load_episodes(tmp_path)


@pytest.mark.parametrize(
    ("terms", "ids"),
    [
        (["reward=1"], {"q-search-open"}),
        (["status=aborted"], {"q-aborted"}),
        (["tool=open"], {"q-search-open"}),
        (["tool=search", "reward=0"], {"q-wrong", "q-aborted"}),
        (["text=copper archive"], {"q-wrong"}),
        (["text=population 4,100"], {"q-search-open"}),
    ],
)
def test_where_keeps_the_matching_episodes(tmp_path: Path, terms: list[str], ids: set[str]) -> None:
    episodes = load_episodes(write_eval_folder(tmp_path))
    chosen = select(episodes, [Where.parse(t) for t in terms])
    assert {e.prompt_id for e in chosen} == ids
    assert len(chosen) == 2 * len(ids)  # both checkpoints


@pytest.mark.parametrize("term", ["reward", "colour=red", "reward=high", "step=x"])
def test_a_bad_where_is_named(term: str) -> None:
    with pytest.raises(ConfigError, match="--where"):
        Where.parse(term)


def test_statistics_per_checkpoint(tmp_path: Path) -> None:
    stats = step_stats(load_episodes(write_eval_folder(tmp_path)))
    assert [s.where for s in stats] == ["base", "step_4"]
    base = stats[0]
    assert (base.episodes, base.reward, base.aborted, base.truncated) == (4, 0.25, 0.25, 0.25)
    assert base.tool_calls == {"open": 0.25, "search": 0.75}
    assert base.malformed == 0.25


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_trajectory_splits_without_raising(text: str) -> None:
    turns = split_turns(text)
    assert turns
    assert all(t.observation is None or t.observation_chars == len(t.observation) for t in turns)


def test_the_terminal_shows_turns_and_folds_observations(tmp_path: Path) -> None:
    folder = write_eval_folder(tmp_path)
    result = deepdive(str(folder), "--where", "tool=open", "--where", "checkpoint=base")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "turn 1" in out and "turn 3" in out and "q-search-open" in out
    assert f"observation ({len(format_observation(LONG_PAGE))} chars)" in out
    assert "more characters" in out
    assert "q-wrong" not in out and "1 of 1 matching" in out
    unfolded = deepdive(str(folder), "--where", "tool=open", "--unfold").stdout
    assert "more characters" not in unfolded


def test_a_bad_where_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    result = deepdive(str(write_eval_folder(tmp_path)), "--where", "colour=red")
    assert result.returncode != 0
    assert "--where 'colour=red'" in result.stderr and "Traceback" not in result.stderr


def test_the_page_is_self_contained_and_escapes_the_model(tmp_path: Path) -> None:
    folder = write_eval_folder(tmp_path)
    page_path = tmp_path / "page.html"
    result = deepdive(str(folder), "--html", str(page_path))
    assert result.returncode == 0, result.stderr
    page = page_path.read_text()
    assert not re.search(r"<(script|img|link|iframe)[^>]*\b(src|href)=", page, re.IGNORECASE)
    assert "http://" not in page and "<link" not in page
    assert page.count("<script>") == 1  # ours; the model's is text
    assert HOSTILE not in page and "&lt;/script&gt;" in page
    assert page.count('<details class="episode"') == 8
    assert page.count("<svg") == 5  # one set of charts: an eval has no training steps


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    reason = missing_browser()
    if reason:
        pytest.skip(reason)
    with headless_chromium(tmp_path_factory.mktemp("browser") / "chromedriver.log") as session:
        session.resize(1200, 900)
        yield session


@pytest.mark.slow
def test_a_browser_renders_filters_and_opens_episodes(browser: Browser, tmp_path: Path) -> None:
    run = write_recorded_run(tmp_path / "run")
    write_eval_folder(run / "eval" / "20261204-061500")
    page = tmp_path / "page.html"
    result = deepdive("run", "--html", str(page), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    browser.open(page.as_uri())
    charts = "return document.querySelectorAll('svg polyline').length"
    assert browser.script(charts) >= 20  # the recorded episodes' and the recorder's statistics
    shown = "return document.getElementById('shown').textContent"
    assert browser.script(shown) == "22 of 22 episodes"
    rows = browser.find_all(".episode")
    assert len(rows) == 22 and all(browser.displayed(row) for row in rows)

    def visible_ids() -> list[str]:
        return list(
            browser.script(
                "return Array.from(document.querySelectorAll('.episode'))"
                ".filter(e => e.offsetParent !== null).map(e => e.dataset.id)"
            )
        )

    def filter_by(terms: str) -> list[str]:
        browser.script(
            "var f = document.getElementById('filter'); f.value = '';"
            "f.dispatchEvent(new Event('input'));"
        )
        if terms:
            browser.type(browser.find("#filter"), terms)
        return visible_ids()

    assert filter_by("tool=open") == ["q-search-open", "q-search-open"]
    assert filter_by("status=aborted checkpoint=step_4") == ["q-aborted"]
    assert filter_by("step=2 reward=1") == ["p0", "p1"]
    assert filter_by("copper") == ["q-wrong", "q-wrong"]
    assert browser.script(shown) == "2 of 22 episodes"
    assert len(filter_by("")) == 22

    chosen = '.episode[data-id="q-search-open"]'
    episode = browser.find(chosen)
    turn = browser.find(f"{chosen} .turn")
    assert not browser.displayed(turn)  # folded until opened
    browser.click(browser.find(f"{chosen} > summary"))
    assert browser.script("return arguments[0].open", {ELEMENT: episode}) is True
    assert len([t for t in browser.find_all(f"{chosen} .turn") if browser.displayed(t)]) == 3
    observation = browser.find(f"{chosen} .observation pre")
    assert not browser.displayed(observation)  # observations folded inside an open episode
    browser.click(browser.find(f"{chosen} .observation > summary"))
    assert browser.displayed(observation)

    shot = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "page.png"
    filter_by("checkpoint=base")
    browser.script("window.scrollTo(0, 0);")
    browser.resize(1200, 1500)
    browser.screenshot(shot)
    assert shot.read_bytes().startswith(b"\x89PNG")


def test_a_local_run_ends_with_the_command_that_writes_its_report(tmp_path: Path) -> None:
    """`make run` (deepdive run) prints it last; the command it prints works on a run folder."""
    run = write_run_folder(tmp_path / "run")
    console = Console(record=True, width=400)
    print_summary({"paths": {"run": str(run)}}, console)
    last = console.export_text().strip().splitlines()[-1]
    assert last.startswith("the report: deepdive trajectories ")
    write, open_it = last.removeprefix("the report: ").split(" && ")
    assert open_it == f"xdg-open {run}/report.html"
    result = deepdive(*shlex.split(write)[2:])
    assert result.returncode == 0, result.stderr
    assert (run / "report.html").read_text().count('<details class="episode"') == 12


def test_without_chromium_the_browser_test_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = missing_browser()
    assert reason and "not installed" in reason and "make browser-install" in reason


PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "div", "p", "input"}
PAGE_TAGS |= {"span", "details", "summary", "pre", "b", "script", "svg", "text", "line"}
PAGE_TAGS |= {"polyline", "circle"}


@settings(max_examples=60, deadline=None)
@given(
    question=unicode_text,
    turns=st.lists(
        st.tuples(model_turns, tool_names, json_values, st.none() | unicode_text), max_size=4
    ),
)
def test_anything_the_model_writes_renders_as_text(
    question: str, turns: list[tuple[str, str, Any, str | None]]
) -> None:
    """Nothing a model writes raises out of the viewer or becomes markup on the page."""
    episode = EpisodeRecord(
        step=1,
        group=0,
        sample=0,
        question=question,
        label=question,
        turns=tuple(
            TurnRecord(
                text=text,
                call=ToolCallRecord(name, {"value": value}),
                observation=observation,
                observation_chars=len(observation or ""),
            )
            for text, name, value, observation in turns
        ),
        answer=question,
        reward=0.0,
        status="completed",
        judge_reason=question,
        prompt_id=question,
    )
    page = render_page(question, [episode], [episode])
    tags = {tag.lower() for tag in re.findall(r"<([A-Za-z][A-Za-z0-9]*)", page)}
    assert tags <= PAGE_TAGS, tags - PAGE_TAGS
    print_episodes([episode], Console(file=io.StringIO(), width=80), limit=5)
