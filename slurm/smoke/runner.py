"""One node's run of the kit: each step in a child process with a deadline, every node's
result shared through the kit's folder, and the nodes moving from step to step together.

After each step every node waits for the others' results (node 0's alone for a step only
node 0 runs), so they all see the same verdicts: at the first failure they all stop (unless
told to keep going) and the later steps are reported as not run. Node 0 writes the report
(report.txt, report.json); the others wait for it before they exit, so no node's exit (srun
ends the job at the first non-zero one) cuts node 0 short.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from services.base.process import child_preexec
from slurm.run_folder import read_json, write_json
from slurm.smoke.context import NoAnswer, SmokeContext
from slurm.smoke.report import Check, StepResult, verdict
from slurm.smoke.steps import Step, plan

# how much longer than a step's own deadline a node waits for the others' results of it
GATHER_MARGIN_S = 300.0
STOP_GRACE_S = 15.0


def run_node(
    steps: list[Step],
    context: SmokeContext,
    keep_going: bool = False,
    say: Callable[[str], None] = print,
) -> list[StepResult]:
    node = context.node
    if node.is_head:
        say(f"gpu-smoke: {len(steps)} step(s) on {context.num_nodes} node(s), in {context.folder}")
        say(plan(steps))
    results: list[StepResult] = []
    stopped = False
    for step in steps:
        if stopped:
            results.append(StepResult(step.number, step.name, 0, 0.0, ran=False))
            continue
        mine: StepResult | None = None
        if step.scope == "every node" or node.is_head:
            say(f"== step {step.number} {step.name} (expected {step.expected}): {step.title}")
            mine = run_step(step, context)
            context.publish(result_key(step, node.node), mine.as_dict())
        gathered = gather(step, context, mine)
        for result in gathered:
            if node.is_head or result.node == node.node:
                prefix = f"  node {result.node} " if context.num_nodes > 1 else "  "
                for line in result.lines(prefix):
                    say(line)
        summary = step_summary(step, gathered)
        say(summary)
        results += gathered
        stopped = not keep_going and not verdict(gathered)
    if node.is_head:
        write_report(context, steps, results, say)
    else:
        with contextlib.suppress(NoAnswer):
            context.await_note("report", "node 0's report", GATHER_MARGIN_S)
    return results


def result_key(step: Step, node: int) -> str:
    return f"step-{step.number}-{step.name}.node-{node}"


def gather(
    step: Step, context: SmokeContext, mine: StepResult | None, margin_s: float = GATHER_MARGIN_S
) -> list[StepResult]:
    """Every node's result of `step` (node 0's alone for a node-0 step), in node order; a node
    that leaves none within the step's deadline and `margin_s` is a failure naming it."""
    nodes = range(context.num_nodes) if step.scope == "every node" else range(1)
    found = []
    for other in nodes:
        if mine is not None and other == mine.node:
            found.append(mine)
            continue
        key = result_key(step, other)
        limit = step.timeout_s + margin_s
        try:
            value = context.await_note(key, f"node {other}'s result of step {step.name}", limit)
            found.append(StepResult.from_dict(value))
        except NoAnswer as error:
            found.append(StepResult(step.number, step.name, other, limit, error=error.message))
    return found


def step_summary(step: Step, results: list[StepResult]) -> str:
    seconds = max((result.seconds for result in results), default=0.0)
    took = f"took {seconds:.0f} s, expected {step.expected}"
    if verdict(results):
        return f"[ok] step {step.number} {step.name} ({took})"
    why = "; ".join(
        f"node {result.node}: {result.why()}" if len(results) > 1 else result.why()
        for result in results
        if not result.ok
    )
    return f"[FAILED] step {step.number} {step.name} ({took}): {why}"


def run_step(step: Step, context: SmokeContext) -> StepResult:
    """The step in its own process, stopped after its deadline; its result file, or why
    there is none."""
    node = context.node.node
    folder = context.step_folder(f"{step.number}-{step.name}")
    context_path = folder / f"context.node-{node}.pickle"
    result_path = folder / f"result.node-{node}.json"
    result_path.unlink(missing_ok=True)
    context_path.write_bytes(pickle.dumps(context))
    command = [context.python, "-m", "slurm.smoke.child", step.function]
    command += [str(context_path), str(result_path)]
    started = time.monotonic()
    process = subprocess.Popen(  # noqa: S603 (our own module, fixed arguments)
        command, start_new_session=True, preexec_fn=child_preexec
    )
    late = None
    try:
        code = process.wait(timeout=step.timeout_s)
    except subprocess.TimeoutExpired:
        code = stop(process)
        late = (
            f"did not finish within {step.timeout_s:g} s (expected {step.expected}); "
            f"stopped (its output is in this node's log)"
        )
    seconds = round(time.monotonic() - started, 1)
    value = read_json(result_path)
    if late is not None or not isinstance(value, dict):
        error = late or f"its process {exit_status(code)} and left no result"
        return StepResult(step.number, step.name, node, seconds, error=error)
    checks = [Check(**check) for check in value.get("checks", [])]
    return StepResult(step.number, step.name, node, seconds, checks, value.get("error"))


def stop(process: subprocess.Popen[bytes]) -> int:
    """SIGTERM to the step's process group, SIGKILL after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        return process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


def exit_status(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def write_report(
    context: SmokeContext, steps: list[Step], results: list[StepResult], say: Callable[[str], None]
) -> None:
    bad = [result for result in results if result.ran and not result.ok]
    names = sorted({f"{result.number} {result.name}" for result in bad})
    ran = {result.number for result in results if result.ran}
    if bad:
        last = f"gpu-smoke: FAILED: step(s) {', '.join(names)} ({bad[0].why()})"
    else:
        last = f"gpu-smoke: ok: {len(ran)} step(s) passed on {context.num_nodes} node(s)"
    skipped = [f"{step.number} {step.name}" for step in steps if step.number not in ran]
    if skipped:
        last += f"; not run: {', '.join(skipped)}"
    say(last)
    lines = [line for result in results for line in result.lines(f"node {result.node} ")]
    text = "\n".join([*lines, last]) + "\n"
    (context.folder / "report.txt").write_text(text)
    write_json(
        context.folder / "report.json",
        {"ok": not bad and bool(ran), "results": [result.as_dict() for result in results]},
    )
    context.publish("report", {"ok": not bad and bool(ran), "summary": last})


def report_path(folder: Path) -> Path:
    return folder / "report.json"
