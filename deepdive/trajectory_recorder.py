"""Each step's episodes, recorded to the run folder off the rollout's hot path.

The rollout log functions (deepdive.aborts: slime calls them in its rollout process, the local
backend at each step) hand a step's samples to `record_step`. There a sample of them is taken
(`trajectory_groups` groups of a training step, every episode of an evaluation) and snapshotted
(the sample's texts and small fields: slime goes on to train on the samples); everything else
(the records, the redaction of every registered secret, the JSON, gzip, the write and the
pruning) happens on one background thread per process (`TrajectoryRecorder`). A step the
writer is too far behind for is dropped and logged, never waited for; the queue is drained when
the process exits.

On disk (deepdive.trajectory_format, docs/trajectories.md): RUN/trajectories/step-N.jsonl.gz
for training, RUN/trajectories/eval/step-N.jsonl.gz for evaluation, and stats.jsonl beside them
(one line per step: the agent statistics, deepdive.agent_stats). When the step files pass
`trajectory_max_mb`, the oldest steps are removed.

Nothing a model writes raises out of here: a record that cannot be built is logged and left
out; the rollout never sees the writer's errors.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson

from deepdive.rollout_settings import settings_from_args, trajectory_dir
from deepdive.sample import status_name
from deepdive.trajectory_format import (
    STATUSES,
    EpisodeRecord,
    Status,
    ToolCallRecord,
    TurnRecord,
    bounded,
    step_files,
    write_step,
)
from services.base.logs import log_event, redact_json

logger = logging.getLogger("deepdive.trajectory_recorder")

EVAL_FOLDER = "eval"
STATS_FILE = "stats.jsonl"
_QUEUE_STEPS = 8  # steps waiting for the writer at most; a later one is dropped
_DRAIN_S = 60.0  # how long an exiting process waits for the writer


@dataclass(frozen=True)
class Snapshot:
    """What a record needs of one sample, taken on the rollout's thread (immutable texts and
    small fields; the sample itself goes on to train)."""

    group: int
    sample: int
    prompt: Any
    label: Any
    response: str
    response_length: int
    reward: Any
    status: str
    stats: dict[str, Any]
    details: dict[str, Any]
    forbidden: Any
    prompt_id: Any
    eval_set: str | None = None


def snapshot(sample: Any, position: int, eval_set: str | None = None) -> Snapshot:
    metadata = getattr(sample, "metadata", None)
    metadata = metadata if isinstance(metadata, dict) else {}
    stats = metadata.get("deepdive")
    details = metadata.get("reward_details")
    env = metadata.get("remote_env_info")
    group = getattr(sample, "group_index", None)
    return Snapshot(
        group=group if isinstance(group, int) else -1,
        sample=position,
        prompt=getattr(sample, "prompt", ""),
        label=getattr(sample, "label", None),
        response=str(getattr(sample, "response", "") or ""),
        response_length=int(getattr(sample, "response_length", 0) or 0),
        reward=getattr(sample, "reward", None),
        status=status_name(sample),
        stats=dict(stats) if isinstance(stats, dict) else {},
        details=dict(details) if isinstance(details, dict) else {},
        forbidden=env.get("forbidden_texts") if isinstance(env, dict) else None,
        prompt_id=metadata.get("id", metadata.get("row_id")),
        eval_set=eval_set,
    )


def choose(samples: list[Any], groups: int | None, eval_set: str | None = None) -> list[Snapshot]:
    """Snapshots of the samples of the first `groups` groups (every group: None), each with its
    position in its group."""
    positions: dict[Any, int] = {}
    chosen = []
    for sample in samples:
        key = getattr(sample, "group_index", None)
        if key not in positions and groups is not None and len(positions) >= groups:
            continue
        position = positions.get(key, -1) + 1
        positions[key] = position
        chosen.append(snapshot(sample, position, eval_set))
    return chosen


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _question(item: Snapshot) -> str:
    """The question as the reward server reads it: the first forbidden text, else the prompt."""
    forbidden = item.forbidden
    if isinstance(forbidden, list | tuple) and forbidden and isinstance(forbidden[0], str):
        return forbidden[0]
    if isinstance(forbidden, str) and forbidden:
        return forbidden
    prompt = item.prompt
    if isinstance(prompt, list):  # messages: the last user turn
        users = [
            m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"
        ]
        return str(users[-1]) if users else ""
    return str(prompt or "")


def _reward(item: Snapshot) -> float:
    reward = item.reward
    if isinstance(reward, dict):
        reward = next(iter(reward.values()), None)
    if isinstance(reward, int | float) and not isinstance(reward, bool):
        value = float(reward)
        return value if value == value and abs(value) != float("inf") else 0.0
    given = item.details.get("reward")
    return float(given) if isinstance(given, int | float) and not isinstance(given, bool) else 0.0


def judge_reason(details: dict[str, Any]) -> str | None:
    """Why the reward is what it is, in one line: the error, the format check, or the judge."""
    error = details.get("error")
    if isinstance(error, dict):
        return f"{error.get('code', 'error')}: {error.get('message', '')}"
    if details.get("format_ok") is False:
        return f"format: {details.get('format_reason') or 'invalid'}"
    judge = details.get("judge")
    if isinstance(judge, dict) and judge.get("reason"):
        return str(judge["reason"])
    if isinstance(details.get("answer_ok"), bool):
        return "correct" if details["answer_ok"] else "wrong answer"
    return None


def _whole(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def turns_of(response: str, turn_log: Any) -> tuple[TurnRecord, ...]:
    """Each model turn of `response`, cut by the hook's turn log (its texts' lengths, in order:
    model text, then its observation)."""
    turns = []
    offset = 0
    for entry in turn_log if isinstance(turn_log, list) else []:
        if not isinstance(entry, dict):
            continue
        chars = _whole(entry.get("chars"))
        text = response[offset : offset + chars]
        offset += chars
        observation = None
        seen = _whole(entry.get("obs_chars"))
        if "obs_chars" in entry:
            observation = bounded(response[offset : offset + seen])
            offset += seen
        call = entry.get("call")
        parsed = None
        if isinstance(call, list | tuple) and len(call) == 2 and isinstance(call[0], str):
            parsed = ToolCallRecord(call[0], call[1] if isinstance(call[1], dict) else {})
        turns.append(
            TurnRecord(
                text=text,
                tokens=_whole(entry.get("tokens")),
                call=parsed,
                call_error=_text(entry.get("call_error")),
                observation=observation,
                observation_chars=seen,
                observation_tokens=_whole(entry.get("obs_tokens")),
                tool_error=_text(entry.get("tool_error")),
            )
        )
    return tuple(turns)


def episode_record(
    item: Snapshot, step: int, evaluation: bool = False, checkpoint: str | None = None
) -> EpisodeRecord:
    """The record of one snapshotted sample."""
    status = item.status.lower() if item.status.lower() in STATUSES else "failed"
    details = item.details
    answer = details.get("extracted_answer")
    return EpisodeRecord(
        step=step,
        group=item.group,
        sample=item.sample,
        question=_question(item),
        label=_text(item.label),
        turns=turns_of(item.response, item.stats.get("turn_log")),
        answer=answer if isinstance(answer, str) else None,
        reward=_reward(item),
        status=cast(Status, status),
        judge_reason=judge_reason(details),
        error=_text(item.stats.get("error")),
        response_tokens=item.response_length,
        evaluation=evaluation or bool(item.stats.get("evaluation")),
        prompt_id=item.prompt_id if isinstance(item.prompt_id, str | int) else None,
        checkpoint=checkpoint,
        eval_set=item.eval_set,
    )


@dataclass(frozen=True)
class _Job:
    step: int
    items: list[Snapshot]
    evaluation: bool
    stats: dict[str, float]


class TrajectoryRecorder:
    """One writer thread for one trajectories folder (per process)."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.dropped = 0
        self._queue: queue.Queue[_Job | None] = queue.Queue(maxsize=_QUEUE_STEPS)
        self._thread = threading.Thread(target=self._run, name="trajectory-writer", daemon=True)
        self._thread.start()
        self._closed = False

    def submit(
        self, step: int, items: list[Snapshot], evaluation: bool, stats: dict[str, float]
    ) -> bool:
        """Queue one step for the writer; False (and logged) when it is too far behind."""
        try:
            self._queue.put_nowait(_Job(step, items, evaluation, stats))
            return True
        except queue.Full:
            self.dropped += 1
            log_event(
                logger, "trajectories_dropped", logging.WARNING, step=step, dropped=self.dropped
            )
            return False

    def flush(self, timeout_s: float = _DRAIN_S) -> None:
        """Wait until every queued step is written (at most `timeout_s`)."""
        done = threading.Event()

        def wait() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        done.wait(timeout_s)

    def close(self, timeout_s: float = _DRAIN_S) -> None:
        if self._closed:
            return
        self._closed = True
        self.flush(timeout_s)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(job)
            except Exception as error:  # the writer logs and goes on: never the rollout's problem
                log_event(logger, "trajectories_failed", logging.WARNING, error=repr(error)[:300])
            finally:
                self._queue.task_done()

    def _write(self, job: _Job) -> None:
        folder = self.folder / EVAL_FOLDER if job.evaluation else self.folder
        records = []
        for item in job.items:
            try:
                records.append(episode_record(item, job.step, job.evaluation))
            except Exception as error:  # one odd sample never costs the step its others
                log_event(
                    logger,
                    "trajectory_skipped",
                    logging.WARNING,
                    step=job.step,
                    error=repr(error)[:300],
                )
        write_step(folder, job.step, records, redact_json)
        if job.stats:
            line = orjson.dumps({"step": job.step, "evaluation": job.evaluation, **job.stats})
            with (self.folder / STATS_FILE).open("ab") as out:
                out.write(line + b"\n")
        prune(self.folder, self.max_bytes)


def prune(folder: Path, max_bytes: int) -> list[Path]:
    """Remove the oldest steps' files (training and evaluation alike) until the rest fit in
    `max_bytes`; the newest step is always kept. Returns what was removed."""
    files = [(step, path) for step, path in step_files(folder)]
    files += step_files(folder / EVAL_FOLDER)
    sized = sorted((step, path, path.stat().st_size) for step, path in files)
    total = sum(size for _, _, size in sized)
    removed = []
    for _step, path, size in sized[:-1]:
        if total <= max_bytes:
            break
        path.unlink(missing_ok=True)
        total -= size
        removed.append(path)
    if removed:
        log_event(logger, "trajectories_pruned", files=len(removed), kept_bytes=total)
    return removed


_RECORDERS: dict[Path, TrajectoryRecorder] = {}
_LOCK = threading.Lock()


def recorder_for(folder: Path, max_bytes: int) -> TrajectoryRecorder:
    """This process's recorder for `folder` (started on first use, drained at exit)."""
    with _LOCK:
        recorder = _RECORDERS.get(folder)
        if recorder is None:
            recorder = TrajectoryRecorder(folder, max_bytes)
            _RECORDERS[folder] = recorder
            atexit.register(recorder.close)
        return recorder


def flush_recorders(timeout_s: float = _DRAIN_S) -> None:
    """Wait until this process's recorders have written every step handed to them."""
    with _LOCK:
        recorders = list(_RECORDERS.values())
    for recorder in recorders:
        recorder.flush(timeout_s)


def record_step(
    folder: Path | None,
    step: int,
    samples: list[Any] | dict[str, list[Any]],
    *,
    groups: int | None,
    max_bytes: int,
    evaluation: bool = False,
    stats: dict[str, float] | None = None,
) -> TrajectoryRecorder | None:
    """Hand a step's samples (a sample of them: `groups` groups, None every one; or each
    evaluation set's, by name) to the folder's writer; nothing without a folder or with
    `groups` 0. Never raises."""
    if folder is None or groups == 0:
        return None
    try:
        sets = samples if isinstance(samples, dict) else {None: samples}
        items = [item for name, part in sets.items() for item in choose(part, groups, name)]
        recorder = recorder_for(folder, max_bytes)
        recorder.submit(step, items, evaluation, stats or {})
        return recorder
    except Exception as error:
        log_event(
            logger, "trajectories_failed", logging.WARNING, step=step, error=repr(error)[:300]
        )
        return None


def record_rollout(
    args: Any,
    step: int,
    samples: list[Any] | dict[str, list[Any]],
    evaluation: bool = False,
    stats: dict[str, float] | None = None,
) -> TrajectoryRecorder | None:
    """`record_step` with the hook's settings (slime's `args`): the folder, the sample (an
    evaluation's every episode) and the disk budget."""
    folder = trajectory_dir(args)
    if folder is None:
        return None
    settings = settings_from_args(args)
    return record_step(
        folder,
        step,
        samples,
        groups=None if evaluation else settings.trajectory_groups,
        max_bytes=int(settings.trajectory_max_mb * 2**20),
        evaluation=evaluation,
        stats=stats,
    )
