"""slime's generate hook: `--custom-generate-function-path deepdive.generate.generate_with_tool`
plays one multi-turn tool episode per sample (the reward hook is deepdive.reward).

Per turn: send the token ids so far to SGLang's /generate (token in, token out: the model's own
tokens are never re-tokenised), stop at the end of a tool call, parse it with the shared
protocol, run it on the tool server (on the one worker of one node's tool server that the
episode's prompt picks: deepdive.routing), and append the observation as tokens with loss mask 0
and log-probability 0.0 (deepdive.episode). Each turn's max_new_tokens shrinks so prompt +
response never exceed the context, and an episode whose next input SGLang's scheduler would
abort (context - 6 tokens and more) ends TRUNCATED first. `finish` ends the episode.

Statuses: COMPLETED (finish called), TRUNCATED (turn limit, context or response budget),
FAILED (malformed call under on_malformed=fail, or a turn without a call), ABORTED (SGLang
aborted or failed: reward 0 is set here, so slime never sees None, in the shape slime reads
with --reward-key; SGLang's own message is kept in the error, and no token of the episode
trains: deepdive.aborts). With --rollout-top-p < 1 each model turn's kept token ids are
stored as slime's trainer replays them (deepdive.top_p). --partial-rollout and the
fully-async rollout, which continue aborted episodes, are refused (deepdive.rollout_modes).

Nothing raises out of the hook but a misconfiguration: a tool server URL that is not ours
(deepdive.service_check) raises ConfigError naming its setting, so the run stops instead of
training on tool-error observations.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from deepdive.aborts import abort_reason, keep_out_of_training, sglang_refusal
from deepdive.clients import service_client
from deepdive.episode import RolloutStats, Trajectory, Turn
from deepdive.observation_tokens import observation_tokens
from deepdive.protocol import (
    BROWSING_TOOLS,
    FINISH,
    TOOL_CALL_CLOSE,
    TOOL_SERVER_FAILED,
    Failure,
    ToolCall,
    ToolReply,
    ToolRequest,
    find_tool_calls,
    format_observation,
)
from deepdive.rollout_modes import refuse_unsupported_modes
from deepdive.rollout_settings import TOKENIZER_ARG, RolloutSettings, settings_from_args
from deepdive.routing import tool_worker_for
from deepdive.sample import forbidden_texts, reward_shaped, status_of
from deepdive.service_check import TOOL_SERVER, checked_client
from deepdive.top_p import TopPSpans, requested, turn_spans
from services.base.errors import ConfigError, DeepDiveError, UpstreamBadResponse, UpstreamError
from services.base.logs import log_event
from services.client.http import Upstream, decode_json_object

# the rollout's logger, which both hooks log to (deepdive.reward too): the name that the log
# lines, and whatever filters them, have always had
logger = logging.getLogger("deepdive.rollout")
# SGLang's scheduler aborts an input of max_req_input_len = max_req_len - 5 tokens or more,
# max_req_len = min(context_len - 1, the KV pool - 1) (python/sglang/srt/managers/scheduler.py
# and utils.py `validate_input_length`, 0.5.15.post1): the longest input it serves is
# context - 7 tokens. An episode stops before it (TRUNCATED), never sent to be ABORTED.
SGLANG_INPUT_RESERVE = 6
_TOKENIZERS: dict[str, Any] = {}


def tokenizer_for(args: Any) -> Any:
    """`args.deepdive_tokenizer` when set (the local backend, tests), else the HF tokenizer of
    `args.hf_checkpoint`, loaded once per process."""
    given = getattr(args, TOKENIZER_ARG, None)
    if given is not None:
        return given
    path = getattr(args, "hf_checkpoint", None)
    if not path:
        raise ConfigError(
            "the rollout needs args.hf_checkpoint (or args.deepdive_tokenizer) for its tokenizer"
        )
    if path not in _TOKENIZERS:
        from transformers import AutoTokenizer  # in the training image; not needed on CPU paths

        _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    return _TOKENIZERS[path]


def render_prompt(sample: Any, tokenizer: Any) -> str:
    """The prompt as text: as slime gives it (after --apply-chat-template), or rendered here."""
    prompt = sample.prompt
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and hasattr(tokenizer, "apply_chat_template"):
        tools = (sample.metadata or {}).get("tools")
        text: str = tokenizer.apply_chat_template(
            prompt, tools=tools, tokenize=False, add_generation_prompt=True
        )
        return text
    raise ConfigError(
        "sample.prompt must be text, or messages with a tokenizer that has a chat template"
    )


async def generate_turn(
    client: Upstream,
    settings: RolloutSettings,
    session_id: str,
    input_ids: list[int],
    params: dict[str, Any],
) -> Turn:
    """One SGLang /generate call, token in and token out. Raises `DeepDiveError` on failure
    (a refusal carries SGLang's message: the client reads 4xx with deepdive.aborts)."""
    payload = {"input_ids": input_ids, "sampling_params": params, "return_logprob": True}
    reply = await client.send(
        "POST",
        "/generate",
        json=payload,
        headers={
            "X-SMG-Routing-Key": session_id
        },  # consistent-hash routing keeps the KV cache warm
        deadline=time.monotonic() + settings.generate_timeout_s,
    )
    data = decode_json_object(reply.content, "sglang")
    try:
        meta = data["meta_info"]
        reason = meta.get("finish_reason") or {}
        finish = reason.get("type") or "stop"
        pairs = meta.get("output_token_logprobs") or []
        ids = [int(item[1]) for item in pairs]
        logprobs = [float(item[0]) if item[0] is not None else 0.0 for item in pairs]
        text = str(data.get("text", ""))
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise UpstreamBadResponse(
            "sglang", "the /generate reply lacks meta_info.output_token_logprobs"
        ) from None
    spans = None
    if requested(params) and finish != "abort":
        try:
            spans = turn_spans(meta if isinstance(meta, dict) else {}, len(ids))
        except ValueError as error:
            raise UpstreamBadResponse("sglang", str(error)) from None
    abort = abort_reason(reason) if finish == "abort" else None
    return Turn(ids, logprobs, text, str(finish), spans, abort)


async def call_tool(
    settings: RolloutSettings,
    tool_url: str,
    session_id: str,
    call: ToolCall,
    forbidden: tuple[str, ...],
) -> ToolReply:
    """The tool server's reply to one tool call, from the episode's tool server worker at
    `tool_url`; a failing tool server becomes a reply too (its error of kind tool_server).
    Raises ConfigError where the URL is not our tool server's (a 404/405, or its check)."""
    client = await checked_client(TOOL_SERVER, tool_url, settings.tool_timeout_s, settings.retries)
    request = ToolRequest(session_id, call.name, call.arguments, forbidden)
    try:  # the client ends every attempt, and every backoff, by the deadline
        reply = await client.send(
            "POST",
            "/tool",
            json=request.as_json(),
            deadline=time.monotonic() + settings.tool_timeout_s,
        )
        return ToolReply.parse(decode_json_object(reply.content, "tool_server"))
    except ConfigError:
        raise  # a wrong URL: the run stops
    except DeepDiveError as error:
        return ToolReply(
            f"The tool server could not run {call.name} ({error.message}). Try again or use "
            "another tool.",
            Failure(TOOL_SERVER_FAILED, error.message),
        )


_CLOSE_TIMEOUT_S = 5.0
_CLOSE_SESSION = ToolCall("close_session")


async def close_session(settings: RolloutSettings, tool_url: str, session_id: str) -> None:
    """Tell the episode's tool server worker the episode is over, so its state goes now rather
    than at expiry. Best effort and brief: a failure is logged by the client and never touches
    the sample."""
    short = replace(settings, tool_timeout_s=min(settings.tool_timeout_s, _CLOSE_TIMEOUT_S))
    await call_tool(short, tool_url, session_id, _CLOSE_SESSION, ())


async def generate_with_tool(
    args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False
) -> Any:
    """slime's custom generate function: the whole multi-turn episode for one sample. Raises
    only ConfigError (a setting slime's args got wrong, a tool server URL that is not ours)."""
    refuse_unsupported_modes(args)
    settings = settings_from_args(args)
    tokenizer = tokenizer_for(args)
    prompt_text = render_prompt(sample, tokenizer)
    observations = observation_tokens(tokenizer)
    sglang = service_client(  # looked up once per episode, not once per turn
        "sglang",
        settings.sglang_url,
        settings.generate_timeout_s,
        settings.retries,
        classify_error=sglang_refusal,
    )
    trajectory = Trajectory.from_prompt(observations.encode(prompt_text))
    if requested(sampling_params):
        trajectory.top_p = TopPSpans()
    session_id = sample.session_id or f"deepdive-{uuid.uuid4().hex}"
    # every call of the episode goes to one worker of one node, the one its prompt picks
    # (deepdive.routing): a group's samples share theirs
    tool_url = tool_worker_for(prompt_text, settings.tool_server_nodes)
    forbidden = forbidden_texts(sample)
    stats = RolloutStats()
    response_budget = int(sampling_params.get("max_new_tokens") or settings.max_context_tokens)
    stops = sampling_params.get("stop") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    base_params = {
        **sampling_params,
        "stop": list(dict.fromkeys([*stops, TOOL_CALL_CLOSE])),
        "no_stop_trim": True,
    }
    longest_input = settings.max_context_tokens - 1 - SGLANG_INPUT_RESERVE
    status = "TRUNCATED"
    while True:
        if stats.turns >= settings.max_turns:
            stats.error = "max_turns"
            break
        max_new = min(
            response_budget - trajectory.response_length,
            settings.max_context_tokens - trajectory.length,
        )
        if max_new <= 0 or trajectory.length > longest_input:
            stats.error = "context_limit"
            break
        started = time.monotonic()
        try:
            turn = await generate_turn(
                sglang,
                settings,
                session_id,
                trajectory.tokens,  # serialised before the call returns; only then does it grow
                _turn_params(base_params, max_new, stats.turns),
            )
        except DeepDiveError as error:  # an UpstreamError's message names sglang already
            named = isinstance(error, UpstreamError)
            stats.error = error.message if named else f"sglang: {error.message}"
            status = "ABORTED"
            break
        finally:
            stats.generation_s += time.monotonic() - started
        stats.turns += 1
        if turn.finish_reason == "abort":
            stats.error = turn.abort
            status = "ABORTED"
            break
        trajectory.add_model_turn(turn)
        logged: dict[str, Any] = {"chars": len(turn.text), "tokens": len(turn.ids)}
        stats.turn_log.append(logged)
        if turn.finish_reason == "length":
            stats.error = "length"
            break
        calls = find_tool_calls(turn.text)
        found = calls[-1] if calls else None
        if found is None or found.call is None:
            reason = (
                "no tool call"
                if found is None
                else (found.error.message if found.error else "malformed")
            )
            stats.error = f"malformed: {reason}"
            stats.tool_calls["malformed"] += 1
            logged["call_error"] = reason
            if settings.on_malformed == "fail":
                status = "FAILED"
                break
            observation = (
                f"Invalid tool call: {reason}. Call exactly one of search, click, open or {FINISH}."
            )
        elif found.call.name == FINISH:
            stats.tool_calls[FINISH] += 1
            logged["call"] = [FINISH, found.call.arguments]
            stats.error = None
            status = "COMPLETED"
            break
        else:
            stats.tool_calls[found.call.name] += 1
            logged["call"] = [found.call.name, found.call.arguments]
            started = time.monotonic()
            reply = await call_tool(settings, tool_url, session_id, found.call, forbidden)
            stats.tool_s += time.monotonic() - started
            stats.count_tool_error(reply)
            if reply.error is not None:
                logged["tool_error"] = reply.error.code
            observation = reply.observation
        text = format_observation(observation)
        ids = observations.ids(text)
        if trajectory.length + len(ids) > longest_input:
            stats.error = "context_limit"
            break
        trajectory.add_observation(ids, text)
        logged["obs_chars"], logged["obs_tokens"] = len(text), len(ids)
    if any(stats.tool_calls[name] for name in BROWSING_TOOLS):
        await close_session(settings, tool_url, session_id)
    return _finish_sample(
        args, sample, trajectory, prompt_text, session_id, status, stats, evaluation
    )


def _turn_params(base: dict[str, Any], max_new: int, turn: int) -> dict[str, Any]:
    """A turn's sampling parameters. A fixed `sampling_seed` (reproducible runs) is offset by
    the turn number, so turns do not replay the same random stream."""
    params = {**base, "max_new_tokens": max_new}
    if isinstance(base.get("sampling_seed"), int):
        params["sampling_seed"] = base["sampling_seed"] + turn
    return params


def _finish_sample(
    args: Any,
    sample: Any,
    trajectory: Trajectory,
    prompt_text: str,
    session_id: str,
    status: str,
    stats: RolloutStats,
    evaluation: bool,
) -> Any:
    sample.prompt = prompt_text
    sample.tokens = trajectory.tokens
    sample.response = "".join(trajectory.parts)
    sample.response_length = trajectory.response_length
    sample.loss_mask = trajectory.mask
    sample.rollout_log_probs = trajectory.logprobs
    if trajectory.top_p is not None:
        sample.rollout_top_p_token_ids = trajectory.top_p.ids
        sample.rollout_top_p_token_offsets = trajectory.top_p.offsets
    sample.session_id = session_id
    sample.status = status_of(sample, status)
    sample.metadata = {**(sample.metadata or {}), "deepdive": stats.as_dict(evaluation)}
    refused = False
    if status == "ABORTED":  # defined, so slime never reads a missing reward
        sample.reward = reward_shaped(args, 0.0)
        keep_out_of_training(sample)
        # slime aborts what is in flight when a rollout has its batch (its `abort`): routine;
        # a refused or failed request is not
        refused = not (stats.error or "").startswith("sglang aborted")
    log_event(
        logger,
        "rollout",
        logging.WARNING if refused else logging.INFO,
        session=session_id,
        status=status,
        turns=stats.turns,
        tokens=sample.response_length,
        error=stats.error,
    )
    return sample
