"""slime's reward hook: `--custom-rm-path deepdive.reward.reward_func` asks the reward server
for each episode's strict binary reward (the generate hook is deepdive.generate).

Nothing raises out of the hook but a misconfiguration: a reward server URL that is not ours
(deepdive.service_check) raises ConfigError naming its setting, so the run stops instead of
training on zero rewards.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from deepdive.protocol import RewardReply, RewardRequest, reward_labels
from deepdive.rollout_settings import RolloutSettings, settings_from_args
from deepdive.routing import node_for
from deepdive.sample import forbidden_texts, reward_shaped, status_name
from deepdive.service_check import REWARD_SERVER, checked_client
from services.base.errors import ConfigError, DeepDiveError, RequestError, UpstreamBadResponse
from services.base.logs import log_event
from services.client.http import Upstream, decode_json_object

# the rollout's logger, shared with the generate hook (deepdive.generate): the name that the
# log lines, and whatever filters them, have always had
logger = logging.getLogger("deepdive.rollout")


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
