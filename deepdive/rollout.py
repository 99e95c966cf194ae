"""The multi-turn tool rollout for slime: `--custom-generate-function-path
deepdive.rollout.generate_with_tool` and `--custom-rm-path deepdive.rollout.reward_func`.

Per turn: send the token ids so far to SGLang's /generate (token in, token out: the model's own
tokens are never re-tokenised), stop at the end of a tool call, parse it with the shared
protocol, run it on the tool server (on the one worker of one node's tool server that the
episode's prompt picks: deepdive.routing), and append the observation as tokens with loss mask 0
and log-probability 0.0. Each turn's max_new_tokens shrinks so prompt + response never exceed the
context, and an episode whose next input SGLang's scheduler would abort (context - 6 tokens and
more) ends TRUNCATED first. `finish` ends the episode.

Statuses: COMPLETED (finish called), TRUNCATED (turn limit, context or response budget),
FAILED (malformed call under on_malformed=fail, or a turn without a call), ABORTED (SGLang
aborted or failed: reward 0 is set here, so slime never sees None, in the shape slime reads
with --reward-key; SGLang's own message is kept in the error, and no token of the episode
trains: deepdive.aborts). With --rollout-top-p < 1 each model turn's kept token ids are
stored as slime's trainer replays them (deepdive.top_p). --partial-rollout and the
fully-async rollout, which continue aborted episodes, are refused (deepdive.rollout_modes).

Nothing raises out of either hook but a misconfiguration: a tool or reward server URL that is
not ours (deepdive.service_check) raises ConfigError naming its setting, so the run stops
instead of training on tool-error observations and zero rewards.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from deepdive.aborts import abort_reason, keep_out_of_training, sglang_refusal
from deepdive.clients import service_client
from deepdive.messages import one_line
from deepdive.observation_tokens import observation_tokens
from deepdive.protocol import (
    BROWSING_TOOLS,
    FINISH,
    TOOL_CALL_CLOSE,
    TOOL_SERVER_FAILED,
    Failure,
    RewardReply,
    RewardRequest,
    ToolCall,
    ToolReply,
    ToolRequest,
    find_tool_calls,
    format_observation,
    reward_labels,
)
from deepdive.rollout_modes import refuse_unsupported_modes
from deepdive.rollout_settings import TOKENIZER_ARG, RolloutSettings, settings_from_args
from deepdive.routing import node_for, tool_worker_for
from deepdive.sample import status_name, status_of
from deepdive.service_check import REWARD_SERVER, TOOL_SERVER, checked_client
from deepdive.tool_errors import TOOL_ERROR_CHARS
from deepdive.top_p import TopPSpans, requested, turn_spans
from services.base.errors import (
    ConfigError,
    DeepDiveError,
    RequestError,
    UpstreamBadResponse,
    UpstreamError,
)
from services.base.logs import log_event
from services.client.http import Upstream, decode_json_object

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


def forbidden_texts(sample: Any) -> tuple[str, ...]:
    """The texts the tool server's leakage filter and the reward's question come from (the
    row's metadata.remote_env_info.forbidden_texts, as `deepdive convert` writes it); a value
    of another shape is sent as it is, for the servers to refuse by name."""
    env = (sample.metadata or {}).get("remote_env_info") or {}
    texts = env.get("forbidden_texts") if isinstance(env, dict) else None
    if not texts:
        return ()
    return tuple(texts) if isinstance(texts, list | tuple) else (texts,)


@dataclass
class Trajectory:
    """The growing episode. `tokens` is prompt + response, one running list (sent as it is to
    /generate every turn, never rebuilt); the response's loss mask and log-probs stay as long as
    the response, always."""

    tokens: list[int]
    prompt_length: int = 0
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    top_p: TopPSpans | None = None  # with --rollout-top-p < 1 (deepdive.top_p)

    @classmethod
    def from_prompt(cls, prompt_ids: list[int]) -> Trajectory:
        return cls(tokens=list(prompt_ids), prompt_length=len(prompt_ids))

    def add_model_turn(self, turn: Turn) -> None:
        self.tokens += turn.ids
        self.mask += [1] * len(turn.ids)
        self.logprobs += turn.logprobs
        self.parts.append(turn.text)
        if self.top_p is not None and turn.top_p is not None:
            self.top_p.add_turn(*turn.top_p)

    def add_observation(self, ids: Sequence[int], text: str) -> None:
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.parts.append(text)
        if self.top_p is not None:
            self.top_p.add_empty(len(ids))

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def length(self) -> int:
        return len(self.tokens)


_TOOL_ERROR_WORDS = 3  # distinct messages kept per episode: what the tools said, not a log


@dataclass
class RolloutStats:
    """An episode's statistics, kept in sample.metadata["deepdive"]. `tool_errors` counts the
    tool calls that failed, by kind (deepdive.protocol.TOOL_ERROR_KINDS; the model's own
    mistakes are none), and `tool_error_words` what the tools said, by message."""

    turns: int = 0
    tool_calls: Counter[str] = field(default_factory=Counter)
    generation_s: float = 0.0
    tool_s: float = 0.0
    error: str | None = None
    tool_errors: Counter[str] = field(default_factory=Counter)
    tool_error_words: Counter[str] = field(default_factory=Counter)
    # per model turn, where its text and its observation lie in sample.response and what the
    # call was (deepdive.trajectory_recorder reads it): a few small fields, not the texts
    turn_log: list[dict[str, Any]] = field(default_factory=list)

    def count_tool_error(self, reply: ToolReply) -> None:
        kind = reply.error_kind
        if kind is None or reply.error is None:
            return
        self.tool_errors[kind] += 1
        said = one_line(reply.error.message, TOOL_ERROR_CHARS)
        if said in self.tool_error_words or len(self.tool_error_words) < _TOOL_ERROR_WORDS:
            self.tool_error_words[said] += 1

    def as_dict(self, evaluation: bool) -> dict[str, Any]:
        return {
            "turns": self.turns,
            "tool_calls": dict(self.tool_calls),
            "tool_errors": dict(self.tool_errors),
            "tool_error_words": dict(self.tool_error_words),
            "error": self.error,
            "generation_s": round(self.generation_s, 4),
            "tool_s": round(self.tool_s, 4),
            "evaluation": evaluation,
            "turn_log": self.turn_log,
        }


@dataclass(frozen=True)
class Turn:
    ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    top_p: tuple[list[int], list[int]] | None = None  # kept ids and offsets, when asked for
    abort: str | None = None  # why SGLang aborted the turn, in its words (deepdive.aborts)


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


def reward_request(sample: Any) -> RewardRequest:
    """What the reward server judges of an episode: its trajectory, the label with the row's
    aliases, whether it finished, and the forbidden texts (the question). Raises RequestError
    for a label that is neither text nor a number (the server would refuse it)."""
    metadata = sample.metadata or {}
    return RewardRequest(
        sample.response,
        reward_labels(sample.label, metadata.get("aliases")),
        client_unfinished=status_name(sample) != "COMPLETED",
        prompt=sample.prompt,
        forbidden_texts=forbidden_texts(sample),
    )


def reward_shaped(args: Any, value: float) -> Any:
    """A reward in the shape slime reads it: the number, or, with --reward-key (and
    --eval-reward-key), a dict holding it under each key, since slime then looks it up by key
    (slime/utils/types.py, `get_reward_value`, lines 246-247; slime/rollout/sglang_rollout.py,
    lines 617-620, for evaluation)."""
    keys = {getattr(args, name, None) for name in ("reward_key", "eval_reward_key")}
    named = sorted(key for key in keys if isinstance(key, str) and key)
    return {key: value for key in named} if named else value


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> Any:
    """slime's custom reward: the reward server's strict binary reward (batch form for a group).

    Each sample's reward comes from the reward server of its prompt's node (deepdive.routing),
    the node its tool calls went to: a batch is sent as one call per node. An aborted sample,
    a sample without a label or an unreachable reward server scores 0.0, and the reason is
    kept in sample.metadata["reward_details"]. When a batch call fails, each of its samples
    is asked for on its own, so one item the server cannot take never costs the group its
    other rewards. Raises only ConfigError: a URL that is not our reward server's.
    """
    samples = sample if isinstance(sample, list) else [sample]
    replies = [RewardReply.failed("not_judged", "aborted or unlabelled")] * len(samples)
    requests: dict[int, RewardRequest] = {}
    for i, s in enumerate(samples):
        if status_name(s) != "ABORTED" and s.label:
            try:
                requests[i] = reward_request(s)
            except RequestError as error:
                replies[i] = RewardReply.failed(error.code, f"the sample's {error.message}")
    if requests:
        settings = settings_from_args(args)
        by_node: dict[str, list[int]] = {}
        for i in requests:
            url = node_for(_routing_text(samples[i]), settings.reward_server_urls)
            by_node.setdefault(url, []).append(i)
        answers = await asyncio.gather(
            *(
                _node_rewards(settings, url, [requests[i] for i in indices])
                for url, indices in by_node.items()
            )
        )
        for indices, results in zip(by_node.values(), answers, strict=True):
            for i, result in zip(indices, results, strict=True):
                replies[i] = result
    for s, reply in zip(samples, replies, strict=True):
        s.metadata = {**(s.metadata or {}), "reward_details": reply.as_json()}
    shaped = [reward_shaped(args, float(reply.reward)) for reply in replies]
    return shaped if isinstance(sample, list) else shaped[0]


def _routing_text(sample: Any) -> str:
    """The prompt the sample's episode was routed by (`generate_with_tool` leaves the rendered
    text in sample.prompt); any other prompt by its repr, so a group still picks one node."""
    prompt = sample.prompt
    return prompt if isinstance(prompt, str) else repr(prompt)


async def _node_rewards(
    settings: RolloutSettings, url: str, requests: list[RewardRequest]
) -> list[RewardReply]:
    """The reward server at `url`'s answers for `requests`: one batch call, or, when it fails,
    one call per request. Raises only ConfigError."""
    client = await checked_client(REWARD_SERVER, url, settings.reward_timeout_s, settings.retries)
    payloads = [request.as_json() for request in requests]
    try:
        results = await _evaluate_batch(client, payloads, settings.reward_timeout_s)
    except ConfigError:
        raise  # a wrong URL: the run stops
    except DeepDiveError as error:
        log_event(
            logger, "reward_failed", logging.WARNING, error=error.message, samples=len(requests)
        )
        results = [_error_result(error)] if len(payloads) == 1 else []
    if not results:  # the batch failed: each sample on its own
        results = list(
            await asyncio.gather(
                *(_evaluate_one(client, p, settings.reward_timeout_s) for p in payloads)
            )
        )
    return results


async def _evaluate_batch(
    client: Upstream, payloads: list[dict[str, Any]], timeout_s: float
) -> list[RewardReply]:
    reply = await client.send(
        "POST", "/evaluate/batch", json=payloads, deadline=time.monotonic() + timeout_s
    )
    results = decode_json_object(b'{"items": ' + reply.content + b"}", "reward_server")["items"]
    if not isinstance(results, list) or len(results) != len(payloads):
        raise UpstreamBadResponse("reward_server", "the batch reply does not match the request")
    return [RewardReply.parse(result) for result in results]


async def _evaluate_one(client: Upstream, payload: dict[str, Any], timeout_s: float) -> RewardReply:
    try:
        reply = await client.send(
            "POST", "/evaluate", json=payload, deadline=time.monotonic() + timeout_s
        )
        return RewardReply.parse(decode_json_object(reply.content, "reward_server"))
    except ConfigError:
        raise
    except DeepDiveError as error:
        return _error_result(error)


def _error_result(error: DeepDiveError) -> RewardReply:
    return RewardReply.failed(error.code, error.message)
