"""`make bench`: run every benchmark of today's code, print a table each, save JSON under
benchmarks/results/ (docs/benchmarks.md lists them). New sessions at 1,024 busy ones run beside
62c9c25 (`new_sessions`: issue 27's regression stays fixed); a tool worker frozen with SIGSTOP
is replaced within 10 s of its last answer (`frozen_worker`, issue 27). The side-by-side
comparison with another commit runs only when named: `--only side_by_side [--baseline REF]
[--parts tools,rollout]`, as does the recorder's cost to the rollout: `--only trajectories
[--baseline REF]`, as do instruction counts under valgrind beside 2a5d2bd: `--only
instructions [--baseline REF] [--parts rollout,tools]`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks import (
    engine,
    frozen_worker,
    instructions,
    job_start,
    local_training,
    new_sessions,
    node_services,
    reward_server,
    rollout,
    side_by_side,
    tool_server,
    trajectories,
)
from benchmarks.baseline import BASELINE_COMMIT
from services.base.errors import DeepDiveError

RESULTS = Path(__file__).with_name("results")


def right_aligned(table: Table, columns: Iterable[str]) -> None:
    """The table's columns, numbers all, aligned right."""
    for column in columns:
        table.add_column(column, justify="right")


def show_tool_server(console: Console, results: dict[str, Any]) -> None:
    title = (
        f"tool server: upstream latency {results['upstream_latency_ms']:.0f} ms, server on one core"
    )
    table = Table(title=title)
    columns = (
        "mode",
        "sessions",
        "calls/s",
        "upstream calls",
        "server CPU ms/call",
        "p50 ms",
        "p99 ms",
        "added p50",
        "added p99",
        "errors",
        "timeouts",
    )
    right_aligned(table, columns)
    for run in results["runs"]:
        table.add_row(
            run["mode"],
            str(run["sessions"]),
            f"{run['calls_per_s']:.0f}",
            f"{run['upstream_calls']}/{run['requests']}",
            f"{run['server_cpu_ms_per_call']:.2f}",
            f"{run['p50_ms']:.1f}",
            f"{run['p99_ms']:.1f}",
            str(run.get("added_p50_ms", "-")),
            str(run.get("added_p99_ms", "-")),
            str(run["errors"]),
            str(run["timeouts"]),
        )
    console.print(table)
    console.print(
        f"GRPO group replay ({tool_server.GROUP_SIZE} samples of one prompt, "
        f"{results['group_distinct_queries']} distinct queries): "
        f"{results['group_calls_with_cache']} upstream calls with the cache, "
        f"{results['group_calls_without_cache']} without"
    )
    big = results["big_page"]
    console.print(
        f"Re-opening a cached 9.6 MB page (40-word forbidden question): "
        f"{big['reopen_p50_ms']} ms p50; /health meanwhile {big['health_p50_ms']} ms p50, "
        f"{big['health_max_ms']} ms max"
    )


def show_reward_server(console: Console, results: dict[str, Any]) -> None:
    title = f"reward server: fake judge latency {results['judge_latency_ms']:.0f} ms, server on one core"
    table = Table(title=title)
    columns = (
        "judge",
        "requests",
        "sessions",
        "evals/s",
        "judge calls",
        "judge peak concurrency",
        "server CPU ms/eval",
        "p50 ms",
        "p99 ms",
        "added p50",
        "added p99",
        "errors",
    )
    right_aligned(table, columns)
    for run in results["runs"]:
        table.add_row(
            run["judge"],
            run["mode"].removeprefix("reward-"),
            str(run["sessions"]),
            f"{run['calls_per_s']:.0f}",
            str(run.get("judge_calls", "-")),
            str(run.get("judge_peak_concurrency", "-")),
            f"{run['server_cpu_ms_per_call']:.2f}",
            f"{run['p50_ms']:.1f}",
            f"{run['p99_ms']:.1f}",
            str(run.get("added_p50_ms", "-")),
            str(run.get("added_p99_ms", "-")),
            str(run["errors"]),
        )
    console.print(table)


def show_local_training(console: Console, results: dict[str, Any]) -> None:
    table = Table(title=f"deepdive run {results['config']}, 3 seeds, one after another")
    columns = (
        "seed",
        "held-out after warm start",
        "held-out after GRPO",
        "lift ± s.e.",
        "train reward first / last 5",
        "GRPO steps/min",
        "rollout s",
        "update s",
        "warm start s",
        "wall s",
    )
    right_aligned(table, columns)
    for run in results["runs"]:
        table.add_row(
            str(run["seed"]),
            f"{run['eval_before']:.3f}",
            f"{run['eval_after']:.3f}",
            f"{run['eval_after'] - run['eval_before']:+.3f} ± {run['lift_se']:.3f}",
            f"{run['train_reward_first']:.2f} / {run['train_reward_last5']:.2f}",
            f"{run['steps_per_minute']:.2f}",
            f"{run['rollout_s']:.0f}",
            f"{run['update_s']:.0f}",
            f"{run['warm_start_s']:.0f}",
            f"{run['wall_s']:.0f}",
        )
    console.print(table)
    console.print(
        f"held-out reward: {results['eval_before_mean']:.3f} after the warm start, "
        f"{results['eval_after_mean']:.3f} after GRPO (mean lift {results['lift_mean']:+.3f} "
        f"± {results['lift_mean_se']:.3f}; "
        f"GRPO lifted {results['lifted_seeds']} of {len(results['runs'])} seeds)"
    )


def show_job_start(console: Console, results: dict[str, Any]) -> None:
    pairs = results["pairs"]
    table = Table(
        title=f"job start, 2-node local Slurm: plain submitit + Ray vs the project's job, "
        f"{len(pairs)} interleaved pairs (seconds from the job's first process start)"
    )
    right_aligned(
        table, ("pair", "first", "plain joined", "ready", "first step", "ready x", "first step x")
    )
    for k, pair in enumerate(pairs):
        table.add_row(
            str(k),
            pair["first"],
            f"{pair['plain']['joined_s']:.2f}",
            f"{pair['project']['ready_s']:.2f}",
            f"{pair['project']['first_step_s']:.2f}",
            f"{pair['ready_ratio']:.2f}",
            f"{pair['first_step_ratio']:.2f}",
        )
    console.print(table)
    phases = Table(title="the project's phases (medians over its jobs)")
    right_aligned(phases, ("phase", "seconds", "ended at s (job clock)"))
    for name, row in results["median_phases"].items():
        phases.add_row(name, f"{row['seconds']:.2f}", f"{row['ended_at_s']:.2f}")
    console.print(phases)
    for name, label in (
        ("ready", "every node in Ray, services ready"),
        ("first_step", "first step"),
    ):
        ratio = results[f"{name}_ratio"]
        goal = results["goals"][name]
        console.print(
            f"{label}: {results[f'{name}_s']['median']:.1f} s vs plain Ray joined "
            f"{results['plain_joined_s']['median']:.1f} s: {ratio['median']:.2f}x the plain join "
            f"(pairs {ratio['min']:.2f}-{ratio['max']:.2f}; goal <= {goal}x: "
            f"{'met' if results['goals_met'][name] else 'NOT met'})"
        )


def show_side_by_side(console: Console, results: dict[str, Any]) -> None:
    """The parts that ran: the tool server's loads and new sessions, the reward server, the
    rollout."""
    tools = results.get("tool_server")
    if tools and tools["loads"]:
        show_side_by_side_loads(console, tools)
    if tools and tools["accept"]:
        show_side_by_side_accept(console, tools)
    if "reward_server" in results:
        show_side_by_side_reward(console, results["reward_server"])
    if "rollout" in results:
        show_side_by_side_rollout(console, results["rollout"])


def show_side_by_side_loads(console: Console, tools: dict[str, Any]) -> None:
    base = tools["baseline"]
    table = Table(title=f"tool server, this checkout vs {base} (side by side, pairs in turn)")
    columns = (
        "load",
        "sessions",
        f"CPU ms/call {base}",
        "CPU ms/call now",
        f"CPU {base} / now",
        f"calls/s {base}",
        "calls/s now",
        f"added p50/p99 {base}",
        "added p50/p99 now",
        "errors then/now",
    )
    right_aligned(table, columns)
    for row in tools["loads"]:
        table.add_row(
            row["mode"],
            str(row["sessions"]),
            f"{row['baseline_server_cpu_ms_per_call']:.3f}",
            f"{row['this_server_cpu_ms_per_call']:.3f}",
            f"{row['cpu_ratio']:.2f}x",
            f"{row['baseline_calls_per_s']:.0f}",
            f"{row['this_calls_per_s']:.0f}",
            f"{row['baseline_added_p50_ms']:.1f} / {row['baseline_added_p99_ms']:.0f}",
            f"{row['this_added_p50_ms']:.1f} / {row['this_added_p99_ms']:.0f}",
            f"{row['baseline_errors']:.0f} / {row['this_errors']:.0f}",
        )
    console.print(table)


def show_side_by_side_accept(console: Console, tools: dict[str, Any]) -> None:
    base = tools["baseline"]
    accept = Table(
        title=f"new sessions at {side_by_side.ACCEPT_SESSIONS} busy sessions (mixed load), and at "
        f"the busiest worker's share of them on {side_by_side.NODE_WORKERS} workers: "
        "connect -> first byte of the first call, and the kernel's accept queue"
    )
    right_aligned(
        accept,
        (
            "tree",
            "sessions",
            "think ms",
            "calls/s",
            "existing calls p50 ms",
            "new first byte p50 ms",
            "p99 ms",
            "max ms",
            "<= 100 ms",
            "accept queue max",
            "accept queue mean",
            "server RSS MiB",
        ),
    )
    for pair in tools["accept"]:
        for side in side_by_side.SIDES:
            run = pair[side]
            accept.add_row(
                base if side == "baseline" else "now",
                str(run["sessions"]),
                str(run["think_ms"]),
                f"{run['calls_per_s']:.0f}",
                f"{run['existing_sessions_p50_ms']}",
                f"{run['first_byte_p50_ms']}",
                f"{run['first_byte_p99_ms']}",
                f"{run['first_byte_max_ms']}",
                f"{run['first_byte_within_100ms']:.0%}",
                f"{run['accept_queue_max']}",
                f"{run['accept_queue_mean']}",
                f"{run['server_rss_mb']}",
            )
    console.print(accept)


def show_side_by_side_reward(console: Console, rewards: dict[str, Any]) -> None:
    base = rewards["baseline"]
    reward = Table(
        title=f"reward server, rule judge, {rewards['sessions']} sessions of new answers "
        f"(this checkout vs {base}; 10 s client timeout)"
    )
    right_aligned(
        reward, ("tree", "CPU ms/eval", "evals/s", "p50 ms", "p99 ms", "max ms", "timeouts")
    )
    for side in side_by_side.SIDES:
        reward.add_row(
            base if side == "baseline" else "now",
            f"{rewards[f'{side}_server_cpu_ms_per_call']:.3f}",
            f"{rewards[f'{side}_calls_per_s']:.0f}",
            f"{rewards[f'{side}_p50_ms']:.1f}",
            f"{rewards[f'{side}_p99_ms']:.1f}",
            f"{rewards[f'{side}_max_ms']:.1f}",
            f"{rewards[f'{side}_timeouts']} of {rewards[f'{side}_requests']}",
        )
    console.print(reward)
    console.print(f"reward server CPU {base} / now: {rewards['cpu_ratio']:.2f}x")


def show_side_by_side_rollout(console: Console, rollouts: dict[str, Any]) -> None:
    base = rollouts["baseline"]
    roll = Table(title=f"rollout CPU per turn, this checkout vs {rollouts['baseline']}")
    right_aligned(
        roll, ("episodes", f"ms/turn {base}", "ms/turn now", f"{base} / now", "identical samples")
    )
    for run in rollouts["runs"]:
        roll.add_row(
            str(run["samples"]),
            f"{run['baseline_cpu_ms_per_turn']:.3f}",
            f"{run['this_cpu_ms_per_turn']:.3f}",
            f"{run['cpu_ratio']:.2f}x",
            "yes" if run["identical_samples"] else "NO",
        )
    console.print(roll)


def show_trajectories(console: Console, results: dict[str, Any]) -> None:
    base = results["baseline"]
    table = Table(title=f"rollout CPU per turn with its episodes recorded, vs {base} (none)")
    right_aligned(
        table,
        (
            "episodes",
            f"ms/turn {base}",
            "sampled",
            "all",
            "sampled / base",
            "all / base",
            "log CPU base / sampled / all",
            "same",
        ),
    )
    for run in results["runs"]:
        table.add_row(
            str(run["samples"]),
            f"{run['baseline_cpu_ms_per_turn']:.4f}",
            f"{run['sampled_cpu_ms_per_turn']:.4f}",
            f"{run['all_cpu_ms_per_turn']:.4f}",
            f"{run['sampled_ratio']:.3f}x",
            f"{run['all_ratio']:.3f}x",
            f"{run['baseline_log_share']:.2%} / {run['sampled_log_share']:.2%} / "
            f"{run['all_log_share']:.2%}",
            "yes" if run["identical_samples"] else "NO",
        )
    console.print(table)


def show_new_sessions(console: Console, results: dict[str, Any]) -> None:
    base = results["baseline"]
    within = f"<= {new_sessions.ANSWERED_S:.0f} s"
    table = Table(
        title=f"new sessions at {results['sessions']:,} busy sessions (mixed load, back to back, "
        f"server on one core), this checkout beside {base}, pairs in turn: connect -> first byte "
        f"of a new connection (one every {new_sessions.PROBE_INTERVAL_S} s), and of "
        f"{new_sessions.BURST} opened with the load's own"
    )
    columns = (
        "round",
        "tree",
        "calls/s",
        "CPU ms/call",
        "existing p50 ms",
        "new p50 ms",
        "new p99 ms",
        within,
        "opened with the load p50 / p99 ms",
        "accept queue mean",
    )
    right_aligned(table, columns)
    for pair in results["pairs"]:
        for side in new_sessions.SIDES:
            run = pair[side]
            table.add_row(
                str(pair["round"]),
                base if side == "baseline" else "now",
                f"{run['calls_per_s']:.0f}",
                f"{run['server_cpu_ms_per_call']:.3f}",
                f"{run['existing_sessions_p50_ms']}",
                f"{run['first_byte_p50_ms']}",
                f"{run['first_byte_p99_ms']}",
                f"{run['answered_within']:.0%}",
                f"{run['burst_p50_ms']} / {run['burst_p99_ms']}",
                f"{run['accept_queue_mean']}",
            )
    console.print(table)
    for side in new_sessions.SIDES:
        pooled = results["summary"][side]["pooled"]
        console.print(
            f"{base if side == 'baseline' else 'now'}, all rounds: new connections p50 "
            f"{pooled['p50_ms']} / p99 {pooled['p99_ms']} ms, {pooled['within']:.0%} {within} "
            f"({pooled['probes']} probes, {pooled['failed']} failed); opened with the load p99 "
            f"{pooled['burst_p99_ms']} ms"
        )


def show_frozen_worker(console: Console, results: dict[str, Any]) -> None:
    table = Table(
        title=f"a tool worker frozen (SIGSTOP) among {results['workers']}, a fresh server a "
        f"round, pings every {results['ping_interval_s']:g} s ({results['ping_timeout_s']:g} s "
        f"each, {results['missed_pings']} misses; found within {results['design_bound_s']:g} s "
        f"by design): seconds from its last answer, and its {results['sessions']} sessions' calls"
    )
    columns = (
        "round",
        "found",
        "replacement answers",
        "in-flight click: session_lost",
        f"click at +{frozen_worker.LATE_S:g} s",
        "next search",
        "other workers' calls",
        "failed",
        "max ms",
    )
    right_aligned(table, columns)
    for run in results["rounds"]:
        calls = run["calls"]
        in_flight = [c for c in calls if c["sent_after_stop_s"] < frozen_worker.LATE_S / 2]
        late = [c for c in calls if c not in in_flight]
        table.add_row(
            str(run["round"]),
            f"{run['found_after_last_answer_s']:.2f}",
            f"{run['replaced_after_last_answer_s']:.2f}",
            f"{max(c['frozen_s'] for c in in_flight):.2f}",
            f"{max(c['frozen_s'] for c in late):.2f}" if late else "-",
            f"{max(c['next_s'] for c in calls):.3f}",
            str(run["others_calls"]),
            str(run["others_failed"]),
            f"{run['others_max_ms']:.0f}",
        )
    console.print(table)
    summary = results["summary"]
    replaced = summary["replaced_after_last_answer_s"]
    console.print(
        f"replaced {replaced['median']:.2f} s (median) / {replaced['max']:.2f} s (max) after the "
        f"last answer, goal <= {summary['goal_s']:g} s; {summary['calls_session_lost']} of "
        f"{summary['calls']} frozen calls session_lost, {summary['next_calls_served']} of "
        f"{summary['next_calls']} next calls served, {summary['others_failed']} of "
        f"{summary['others_calls']} other workers' calls failed: goal "
        f"{'met' if summary['goal_met'] else 'NOT met'}"
    )


def show_node_services(console: Console, results: dict[str, Any]) -> None:
    table = Table(
        title=f"a 2-node slime job's services: {results['rollouts']} rollouts of "
        f"{results['groups_per_rollout']} groups x {results['samples_per_group']} samples, "
        f"{results['workers_per_node']} tool workers per node, upstreams "
        f"{results['upstream_latency_ms']:.0f} ms (medians of {results['repeats']})"
    )
    table.add_column("YAML")
    columns = (
        "node",
        "tool calls",
        "Serper calls",
        "tool server CPU s",
        "reward calls",
        "judge calls",
        "reward server CPU s",
    )
    right_aligned(table, columns)
    for run in results["runs"]:
        for number, node in enumerate(run["nodes"]):
            table.add_row(
                run["yaml"] if number == 0 else "",
                str(number),
                f"{node['tool_calls']:.0f}",
                f"{node['serper_calls']:.0f}",
                f"{node['tool_cpu_s']:.2f}",
                f"{node['reward_calls']:.0f}",
                f"{node['judge_calls']:.0f}",
                f"{node['reward_cpu_s']:.2f}",
            )
    console.print(table)


def run_side_by_side(console: Console, args: argparse.Namespace) -> None:
    parts = set(args.parts.split(","))
    unknown = parts - set(side_by_side.PARTS)
    if unknown:
        raise SystemExit(
            f"--parts: unknown {', '.join(sorted(unknown))} "
            f"(expected some of {','.join(side_by_side.PARTS)})"
        )
    results: dict[str, Any] = {}
    if parts & {"tools", "accept"}:
        results["tool_server"] = side_by_side.tool_server(
            args.seconds, args.baseline, loads="tools" in parts, accept="accept" in parts
        )
    if "reward" in parts:
        results["reward_server"] = side_by_side.reward_server(args.seconds, args.baseline)
    if "rollout" in parts:
        results["rollout"] = side_by_side.rollout(args.baseline)
    (RESULTS / "side_by_side.json").write_text(json.dumps(results, indent=2))
    show_side_by_side(console, results)


def instruction_parts(args: argparse.Namespace) -> tuple[str, ...]:
    """`--parts` for `--only instructions`: both unless named (side_by_side's default list
    names both)."""
    named = args.parts.split(",")
    unknown = set(named) - set(instructions.PARTS) - set(side_by_side.PARTS)
    chosen = tuple(part for part in instructions.PARTS if part in named)
    if unknown or not chosen:
        raise SystemExit(
            f"--parts: instructions runs some of {','.join(instructions.PARTS)} (got {args.parts})"
        )
    return chosen


def instruction_runs(part: dict[str, Any]) -> str:
    """What the two run lengths of a part were, the longer first."""
    if "batches" in part:
        short, long = part["batches"]
        return f"{part['samples']} episodes x {part['turns']} turns, batches {long} - {short}"
    short, long = part["calls"]
    return f"calls {long} - {short}, {part['concurrency']} in flight"


def show_instructions(console: Console, results: dict[str, Any]) -> None:
    base = results["baseline"]
    table = Table(
        title=f"instructions (valgrind's callgrind, Ir) per unit of work, this checkout vs "
        f"{base}: differences of two run lengths, {results['repeats']} repetitions in turn"
    )
    table.add_column("part")
    columns = (
        "runs",
        f"Ir/unit {base}",
        "Ir/unit now",
        f"now / {base}",
        "per repetition",
        f"spread {base} / now",
        "identical samples",
        "seconds",
    )
    right_aligned(table, columns)
    rows = {"rollout": "rollout, per turn", "tool_server": "tool server misses, per call"}
    for key, label in rows.items():
        part = results.get(key)
        if part is None:
            continue
        unit = part["unit"]
        identical = part.get("identical_samples")
        table.add_row(
            label,
            instruction_runs(part),
            f"{part[f'baseline_ir_per_{unit}']:,}",
            f"{part[f'this_ir_per_{unit}']:,}",
            f"{part['ratio']:.3f}x",
            ", ".join(f"{ratio:.3f}" for ratio in part["ratios"]),
            f"{part['baseline_spread']:.2%} / {part['this_spread']:.2%}",
            "-" if identical is None else "yes" if identical else "NO",
            str(part["seconds"]),
        )
    console.print(table)
    console.print(f"{results['valgrind']}, {results['seconds']} s in all")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--seconds", type=int, default=8, help="duration of each load run")
    parser.add_argument("--pairs", type=int, default=3, help="job_start's interleaved job pairs")
    parser.add_argument(
        "--only",
        choices=[
            "tool_server",
            "reward_server",
            "rollout",
            "engine",
            "job_start",
            "local_training",
            "new_sessions",
            "frozen_worker",
            "side_by_side",
            "node_services",
            "trajectories",
            "instructions",
        ],
        help="run one benchmark (side_by_side, trajectories and instructions run only when named)",
    )
    parser.add_argument(
        "--baseline",
        default=None,
        metavar="REF",
        help=f"side_by_side, trajectories, new_sessions, instructions: the commit (or a folder "
        f"holding a checkout) to compare this checkout with (default {BASELINE_COMMIT}; "
        f"trajectories: {trajectories.BASELINE}; new_sessions: {new_sessions.BASELINE}; "
        f"instructions: {instructions.BASELINE})",
    )
    parser.add_argument(
        "--parts",
        default=",".join(side_by_side.PARTS),
        help=f"side_by_side: which parts, comma-separated (default {','.join(side_by_side.PARTS)}); "
        f"instructions: some of {','.join(instructions.PARTS)} (default both)",
    )
    args = parser.parse_args()
    console = Console(width=160)
    RESULTS.mkdir(exist_ok=True)
    if args.only == "side_by_side":
        args.baseline = args.baseline or BASELINE_COMMIT
        run_side_by_side(console, args)
    if args.only == "instructions":
        results = instructions.run(args.baseline or instructions.BASELINE, instruction_parts(args))
        (RESULTS / "instructions.json").write_text(json.dumps(results, indent=2))
        show_instructions(console, results)
    if args.only == "trajectories":
        results = trajectories.run(args.baseline or trajectories.BASELINE)
        (RESULTS / "trajectories.json").write_text(json.dumps(results, indent=2))
        show_trajectories(console, results)
    if args.only in (None, "tool_server"):
        results = tool_server.run(seconds=args.seconds)
        (RESULTS / "tool_server.json").write_text(json.dumps(results, indent=2))
        show_tool_server(console, results)
    if args.only in (None, "reward_server"):
        results = reward_server.run(seconds=args.seconds)
        (RESULTS / "reward_server.json").write_text(json.dumps(results, indent=2))
        show_reward_server(console, results)
    if args.only in (None, "new_sessions"):
        results = new_sessions.run(args.baseline or new_sessions.BASELINE)
        (RESULTS / "new_sessions.json").write_text(json.dumps(results, indent=2))
        show_new_sessions(console, results)
    if args.only in (None, "frozen_worker"):
        results = frozen_worker.run()
        (RESULTS / "frozen_worker.json").write_text(json.dumps(results, indent=2))
        show_frozen_worker(console, results)
    if args.only in (None, "rollout"):
        results = rollout.run()
        (RESULTS / "rollout.json").write_text(json.dumps(results, indent=2))
        console.print(
            f"rollout: {results['samples']} concurrent samples x {results['turns_per_sample']} turns "
            f"({results['completed']} completed) against instant fakes, rollout on one core: "
            f"{results['turns_per_s']:.0f} turns/s, {results['rollout_cpu_ms_per_turn']:.2f} ms of CPU "
            f"per turn ({results['turns_per_cpu_s']:.0f} turns per CPU-second)"
        )
    if args.only in (None, "engine"):
        results = engine.run()
        (RESULTS / "engine.json").write_text(json.dumps(results, indent=2))
        speeds = ", ".join(
            f"batch {r['batch']}: {r['tokens_per_s']:.0f} tokens/s" for r in results["runs"]
        )
        console.print(f"local engine ({results['parameters']:,} parameters, one thread): {speeds}")
    if args.only in (None, "job_start"):
        results = job_start.run(pairs=args.pairs)
        (RESULTS / "job_start.json").write_text(json.dumps(results, indent=2))
        show_job_start(console, results)
    if args.only in (None, "node_services"):
        results = node_services.run()
        (RESULTS / "node_services.json").write_text(json.dumps(results, indent=2))
        show_node_services(console, results)
    if args.only in (None, "local_training"):
        results = local_training.run()
        (RESULTS / "local_training.json").write_text(json.dumps(results, indent=2))
        show_local_training(console, results)


if __name__ == "__main__":
    try:
        main()
    except DeepDiveError as error:  # a missing tool, no baseline tree: said, not a traceback
        print(f"benchmarks: {error.message}", file=sys.stderr)
        raise SystemExit(2) from None
