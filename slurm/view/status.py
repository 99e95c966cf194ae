"""What a run is doing, read from its folder (and Slurm): `deepdive status`.

Everything comes from files the job writes anyway: the jobs it was submitted as, the newest
attempt and its phase logs, the failure notes, the trainer's TensorBoard events (slime's
`--use-tensorboard` and the local backend both write them to RUN/logs/tensorboard), the
finished note.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from services.base.errors import ConfigError
from slurm.node.phases import read_phases
from slurm.run_folder import AttemptFolder, RunFolder, read_json
from slurm.view import event_files

# The tag of the mean training reward of a step: slime's rollout/raw_reward (slime/ray/rollout.py and
# slime/observability/train_metric_utils.py at 624b824, logged with step "rollout/step"), the
# local backend's reward_mean (deepdive/local/run_log.py).
REWARD_TAGS = ("rollout/raw_reward", "reward_mean")
# The agent's statistics of a step (deepdive.agent_stats), logged at the reward's step: slime's
# through our rollout log function, the local backend's with its metrics.
AGENT_PREFIXES = ("rollout/deepdive/agent/", "agent/")


def jobs_index() -> Path:
    """Where the CLI remembers which run folder each job id belongs to."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "deepdive" / "jobs.jsonl"


def remember_job(job_id: str, folder: Path) -> None:
    index = jobs_index()
    index.parent.mkdir(parents=True, exist_ok=True)
    with index.open("ab") as out:
        out.write(orjson.dumps({"job_id": job_id, "run": str(folder)}) + b"\n")


def find_run(target: str) -> RunFolder:
    """A run folder, or the run folder a job id was submitted from."""
    path = Path(target).expanduser()
    if RunFolder(path).config.is_file():
        return RunFolder(path.absolute())
    if target.isdigit():
        try:
            lines = jobs_index().read_bytes().splitlines()
        except FileNotFoundError:
            lines = []
        for line in reversed(lines):
            entry = orjson.loads(line)
            if entry.get("job_id") == target:
                return RunFolder(Path(entry["run"]))
        raise ConfigError(f"job {target}: not submitted with deepdive submit from this account")
    raise ConfigError(f"{target}: not a run folder (no config.toml) and not a job id")


@dataclass
class RunStatus:
    run: Path
    job_id: str | None = None
    state: str | None = None  # Slurm's, while it knows the job
    attempt: str | None = None
    attempts: int = 0
    phase: str | None = None  # node 0's newest phase and event
    failures: list[dict[str, Any]] = field(default_factory=list)
    step: int | None = None
    reward: float | None = None
    finished: bool = False
    nodes: dict[int, str] = field(default_factory=dict)  # each node's newest phase
    requeue: str | None = None  # the newest attempt's requeue: asked, requeued or refused
    checkpoint: int | None = None  # the newest complete checkpoint's step
    # what a requeue loses (the steps logged since that checkpoint, redone by the next attempt)
    redo: str | None = None
    # the newest warning (preemption or time limit): the save it made, or why none, and what
    # its requeue lost (slurm/node/preemption.py)
    warning: str | None = None
    # the agent's statistics at `step` (deepdive.agent_stats: tool calls, turns, rates)
    agent: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON's keys are strings: the nodes' numbers become "0", "1", ..."""
        fields = {key: value for key, value in self.__dict__.items() if key != "run"}
        fields["nodes"] = {str(node): phase for node, phase in self.nodes.items()}
        return fields | {"run": str(self.run)}


def requeue_state(attempt: AttemptFolder) -> str | None:
    """What became of a requeue node 0 asked for in this attempt (slurm/requeue.py)."""
    answer = read_json(attempt.requeue_answer)
    if isinstance(answer, dict) and answer.get("requeued") is True:
        return "requeued by Slurm: the next attempt starts when Slurm runs the job again"
    if isinstance(answer, dict):
        return f"REFUSED by Slurm: {answer.get('error') or 'no reason given'}"
    if attempt.requeue_asked.exists():
        return "asked: the batch script requeues the job once every node has stopped"
    return None


def run_status(run: RunFolder, state_of: Any = None) -> RunStatus:
    status = RunStatus(run.root)
    jobs = run.submitted_jobs()
    if jobs:
        status.job_id = str(jobs[-1]["job_id"])
        if state_of is not None:
            status.state = state_of(status.job_id)
    status.finished = run.finished.exists()
    attempts = [path for path in run.attempts.glob("*-*") if path.is_dir()]
    status.attempts = len(attempts)
    latest = run.latest_attempt()
    if latest is not None:
        status.attempt = latest.root.name
        status.failures = latest.failures()
        for phases_file in sorted(latest.root.glob("node-*.phases.jsonl")):
            lines = read_phases(phases_file)
            if lines:
                last = lines[-1]
                status.nodes[int(last["node"])] = f"{last['phase']} {last['event']}"
        status.phase = status.nodes.get(0)
        status.requeue = requeue_state(latest)
    reward = event_files.latest(run.tensorboard, REWARD_TAGS)
    if reward is not None:
        status.step, status.reward = reward.step, reward.value
        status.agent = event_files.at_step(run.tensorboard, reward.step, AGENT_PREFIXES)
    note = read_json(run.finished)
    if isinstance(note, dict):
        status.finished = True
    status.checkpoint = checkpoint_step(run)
    status.redo = redone(status.step, status.checkpoint)
    status.warning = last_warning(run)
    return status


def last_warning(run: RunFolder) -> str | None:
    """The newest attempt's warning that node 0 acted on (its end note), in words."""
    for attempt in reversed(run.attempts_in_order()):
        end = read_json(attempt.end)
        warning = end.get("warning") if isinstance(end, dict) else None
        if isinstance(warning, dict) and warning:
            return f"attempt {attempt.root.name}: {describe_warning(warning)}"
    return None


def describe_warning(warning: dict[str, Any]) -> str:
    """One warning's end note in words: the save, then what the requeue lost."""
    what = warning.get("save")
    if what == "saved":
        done = (
            f"saved step {warning.get('saved_step')} at the next rollout boundary "
            f"({warning.get('save_s')} s save, {warning.get('waited_s')} s after the warning)"
        )
    else:
        done = f"no save on the warning ({what}: {warning.get('why')})"
    lost = warning.get("lost") or "nothing: no step was logged"
    return f"{done}; the requeue lost {lost}"


def checkpoint_step(run: RunFolder) -> int | None:
    """The newest complete checkpoint's step, as the run's backend keeps them (None: none yet,
    or a saved experiment this launcher cannot read)."""
    from slurm.backends import build_backend
    from slurm.config import load_experiment

    if not run.config.is_file():
        return None
    try:
        return build_backend(load_experiment(run.config)).checkpoint_step()
    except ConfigError:
        return None


def redone(step: int | None, checkpoint: int | None) -> str | None:
    """What a requeue now would cost: the steps after the checkpoint, redone (their metrics
    are dropped and logged again)."""
    if step is None:
        return None
    if checkpoint is None:
        return f"every step so far (1-{step}): no checkpoint yet" if step >= 1 else None
    if step <= checkpoint:
        return "nothing: the newest step is checkpointed"
    lost = step - checkpoint
    return f"{lost} step(s), {checkpoint + 1}-{step}, since the checkpoint at step {checkpoint}"


# what `deepdive status` prints of the agent's statistics, in this order: (key, label, format)
AGENT_SHOWN = (
    ("tool_calls/search", "search", "{:.2f}"),
    ("tool_calls/click", "click", "{:.2f}"),
    ("tool_calls/open", "open", "{:.2f}"),
    ("turns", "turns", "{:.1f}"),
    ("finish_rate", "finished", "{:.0%}"),
    ("malformed_rate", "malformed", "{:.0%}"),
    ("truncated_rate", "truncated", "{:.0%}"),
    ("aborted_rate", "aborted", "{:.0%}"),
    ("leakage_blocks", "leaks blocked", "{:.2f}"),
    ("response_tokens", "tokens", "{:.0f}"),
)


def agent_line(agent: dict[str, float]) -> str | None:
    """The agent's statistics on one line (per episode, the rates as shares), or None."""
    parts = [
        f"{label} {shape.format(agent[key])}" for key, label, shape in AGENT_SHOWN if key in agent
    ]
    return ", ".join(parts) if parts else None
