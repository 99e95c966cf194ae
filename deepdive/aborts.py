"""Aborted episodes: why they aborted, in SGLang's own words, and kept out of training.

An episode is ABORTED when SGLang refuses or fails a turn: a prompt longer than its context
(HTTP 400), sampling it cannot do (`--rollout-top-p` < 1 without slime's SGLang patch), an
engine that crashed or is unreachable, or slime aborting in-flight requests. What SGLang said
is what a person needs to fix it, so it is kept in the sample's error (`metadata["deepdive"]
["error"]`): the refused reply's message (SGLang answers `{"error": {"message": ...}}`,
python/sglang/srt/entrypoints/http_server.py; a router may answer text), or the abort's
`finish_reason.message`; on one line, capped, with every registered secret redacted.

An aborted episode is not a wrong answer: it must not train as one (`keep_out_of_training`).
Many of them say the infrastructure is failing, not the policy: each rollout's aborted count
and share go to slime's rollout metrics, and a rollout with more than `max_aborted_share` of
its episodes aborted stops the run with SGLang's words and the count (`log_rollout`).
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from deepdive.agent_stats import SLIME_PREFIX, agent_statistics
from deepdive.eval_metrics import answered_view, has_aborted
from deepdive.messages import most_said, one_line
from deepdive.rollout_settings import arg_name, settings_from_args
from deepdive.sample import status_name
from deepdive.tool_errors import check_tool_error_share, tool_error_counts, tool_error_metrics
from deepdive.trajectory_recorder import record_rollout
from services.base.errors import DeepDiveError, RuntimeFailure, UpstreamBadResponse
from services.base.logs import log_event
from services.client.http import UpstreamReply

logger = logging.getLogger("deepdive.aborts")

_NOT_REFUSALS = frozenset({401, 402, 403, 429})  # the client's own rules: keys, rate limits


def _words(value: Any) -> str | None:
    """The message in a decoded error body: SGLang's error.message, or a router's or a
    framework's message / detail / error text (a few levels deep at most: a body nested a
    thousand deep is read as text, never recursed into)."""
    for _ in range(4):
        if isinstance(value, str):
            return value
        if not isinstance(value, dict):
            return None
        value = next((value[key] for key in ("error", "message", "detail") if value.get(key)), None)
    return None


def sglang_message(content: bytes) -> str:
    """SGLang's own words in a refused reply's body: the message of its JSON error, else the
    body as text. Never raises, whatever the bytes."""
    try:
        decoded = orjson.loads(content)
    except orjson.JSONDecodeError:
        decoded = None
    found = _words(decoded)
    text = found if found is not None else content.decode("utf-8", errors="replace")
    return one_line(text) or "(no message)"


def sglang_refusal(reply: UpstreamReply) -> DeepDiveError | None:
    """The SGLang client's reading of a 4xx (services.client.http's `classify_error`): the request
    itself was refused, so retrying cannot help, and the error carries SGLang's message
    (the generic rule keeps only the status). Keys (401-403) and rate limits (429) keep the
    client's own rules; a 5xx is retried and named by its status."""
    status = reply.status_code
    if 400 <= status < 500 and status not in _NOT_REFUSALS:
        return UpstreamBadResponse("sglang", f"HTTP {status}: {sglang_message(reply.content)}")
    return None


def abort_reason(finish_reason: Any) -> str:
    """Why SGLang aborted a turn (its `finish_reason.message`, when it gave one)."""
    message = finish_reason.get("message") if isinstance(finish_reason, dict) else None
    return f"sglang aborted: {one_line(str(message))}" if message else "sglang aborted"


def keep_out_of_training(sample: Any) -> None:
    """An aborted episode is no answer: no token of it trains. slime zeroes the loss mask of a
    sample with `remove_sample` set (slime/ray/rollout.py, lines 680-681) and a zero mask adds
    nothing to the loss (slime/backends/megatron_utils/cp_utils.py, lines 73-81); the mask is
    zeroed here too, so the exclusion holds where `remove_sample` is not read (a custom
    --custom-convert-samples-to-train-data-path, the local trainer). Its reward, 0, is left
    out of its group's mean and std (deepdive.group_rewards, slime's normalisation over the
    answered episodes), and deepdive.filters drops such a group when the over-sampled batch
    has one to spare."""
    sample.remove_sample = True
    sample.loss_mask = [0] * sample.response_length


class RolloutAborted(RuntimeFailure, RuntimeError):
    """More of a rollout's episodes aborted than `max_aborted_share` allows: SGLang is
    refusing or failing requests, and training on what is left would hide it."""


def _flat(samples: Iterable[Any]) -> list[Any]:
    found: list[Any] = []
    for item in samples:
        found.extend(_flat(item) if isinstance(item, list) else [item])
    return found


def aborted_errors(samples: list[Any]) -> Counter[str]:
    """How many aborted episodes ended on each error (the hook's stored error)."""
    errors: Counter[str] = Counter()
    for sample in samples:
        if status_name(sample) == "ABORTED":
            metadata = getattr(sample, "metadata", None)
            stats = metadata.get("deepdive") if isinstance(metadata, dict) else None
            error = stats.get("error") if isinstance(stats, dict) else None
            errors[str(error or "no error recorded")] += 1
    return errors


# what to check when SGLang fails a rollout's episodes inside slime, and the setting
SLIME_HINTS = (
    "Check SGLang's log; a context too long for the model (slime.rollout.max_context_len "
    "against the model's and slime.sglang.context_length), --rollout-top-p below 1 on an "
    "SGLang without slime's patch, an engine that died. The limit is "
    "slime.deepdive.max_aborted_share."
)


def check_aborted_share(
    samples: list[Any],
    limit: float,
    rollout_id: int,
    eval_set: str | None = None,
    hints: str = SLIME_HINTS,
) -> int:
    """The number of `samples` that aborted; logged when any did. Raises RolloutAborted when
    their share is above `limit`, naming the count and what SGLang said, most often first,
    then `hints`: where to look, and the setting."""
    errors = aborted_errors(samples)
    aborted = sum(errors.values())
    if not aborted:
        return 0
    share = aborted / len(samples)
    log_event(
        logger,
        "rollout_aborted",
        logging.WARNING,
        rollout=rollout_id,
        eval_set=eval_set,
        aborted=aborted,
        samples=len(samples),
        share=round(share, 4),
        error=errors.most_common(1)[0][0],
    )
    if share > limit:
        what = f"eval {eval_set} at rollout {rollout_id}" if eval_set else f"rollout {rollout_id}"
        said = most_said(errors)
        raise RolloutAborted(
            f"{what}: {aborted} of {len(samples)} episodes ABORTED ({share:.0%}), more than "
            f"{arg_name('max_aborted_share')} = {limit:g} allows; SGLang failed them, not the "
            f"policy. SGLang said: {said}. {hints}"
        )
    return aborted


def log_rollout(
    rollout_id: int, args: Any, samples: list[Any], metrics: Any, rollout_time: float
) -> bool:
    """--custom-rollout-log-function-path: slime calls it with each rollout's samples before
    it logs them and before they train (slime/observability/rollout_metrics.py, lines
    256-260, from slime/ray/rollout.py, line 506, in RolloutManager.generate, whose error
    train.py's ray.get raises: train.py, line 53). The aborted count and share, and the tool
    calls that failed by kind (deepdive.tool_errors), join the rollout's metrics, which slime
    logs next (lines 265-271); returns False so it does. So do the agent's statistics
    (deepdive.agent_stats); and a sample of the rollout's episodes is recorded to the run
    folder (deepdive.trajectory_recorder, written on a background thread of this process:
    slime's rollout process)."""
    flat = _flat(samples)
    settings = settings_from_args(args)
    aborted = sum(aborted_errors(flat).values())
    agent = agent_statistics(flat)
    if isinstance(metrics, dict):
        metrics["rollout/deepdive/aborted"] = aborted
        metrics["rollout/deepdive/aborted_ratio"] = aborted / len(flat) if flat else 0.0
        metrics.update(tool_error_metrics(tool_error_counts(flat)))
        metrics.update({SLIME_PREFIX + key: value for key, value in agent.items()})
    # recorded before the checks: a rollout that stops the run keeps its episodes
    record_rollout(args, rollout_id, flat, stats=agent)
    check_aborted_share(flat, settings.max_aborted_share, rollout_id)
    check_tool_error_share(flat, settings.max_tool_error_share, rollout_id)
    return False


def log_eval_rollout(
    rollout_id: int,
    args: Any,
    data: Any,
    extra_metrics: Any,
    slime_log: Callable[[int, Any, Any, Any], Any] | None = None,
) -> bool:
    """--custom-eval-rollout-log-function-path: the same rules for each evaluation set
    (slime/observability/rollout_metrics.py, lines 223-227): an eval mostly aborted measures
    SGLang, not the policy, and one whose tools mostly failed measures the tools. Without an
    aborted episode it returns False: slime logs the evaluation as usual. With one, the
    evaluation is logged here, by slime's own `log_eval_rollout_data` (or `slime_log`, its
    stand-in where slime is not installed), over the answered episodes with the aborted count
    beside (deepdive.eval_metrics), and it returns True so slime does not log it again."""
    settings = settings_from_args(args)
    sets = {
        str(name): _flat(result.get("samples") or []) if isinstance(result, dict) else []
        for name, result in (data or {}).items()
    }
    every = [sample for samples in sets.values() for sample in samples]
    record_rollout(args, rollout_id, sets, evaluation=True, stats=agent_statistics(every))
    for name, samples in sets.items():
        check_aborted_share(samples, settings.max_aborted_share, rollout_id, name)
        check_tool_error_share(samples, settings.max_tool_error_share, rollout_id, name)
    if not has_aborted(data):
        return False
    answered, metrics, quiet = answered_view(args, data, extra_metrics)
    log = slime_log if slime_log is not None else _slime_eval_log()
    log(rollout_id, quiet, answered, metrics)
    return True


def _slime_eval_log() -> Callable[[int, Any, Any, Any], Any]:
    """slime's own eval logging (inside slime's rollout manager, where slime imports)."""
    module = importlib.import_module("slime.observability.rollout_metrics")
    log: Callable[[int, Any, Any, Any], Any] = module.log_eval_rollout_data
    return log
