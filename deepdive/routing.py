"""Which node of the job, and which of its tool server workers, plays an episode: picked by
the rollout from the prompt, so no proxy sits between the rollout and the services.

Why the prompt: a session is state in one worker (`click` opens a result of the session's own
latest `search`), so every call of an episode must reach the same worker; and the samples of a
GRPO group share their prompt and repeat each other's first searches, so sending the whole
group to one worker lets its cache (and its collapsing of identical calls in flight) pay for
those searches once. The hash is blake2b of the prompt's UTF-8 text, never Python's `hash()`,
which is salted per process: every rollout process must pick the same worker for a prompt.

Over the job's nodes (slime's rollout reaches every node's services): the hash's remainder by
the number of nodes picks the node, and the quotient's remainder by that node's workers picks
the worker, so a group keeps to one worker of one node while groups spread over the nodes;
a group's reward calls go to the reward server of the same node (`node_for`, with one reward
server per node). With one node the pick is the worker this module always picked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _digest(prompt_text: str) -> int:
    digest = hashlib.blake2b(prompt_text.encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def node_index(prompt_text: str, nodes: int) -> int:
    """The position, among `nodes` nodes, of the one whose services play this prompt."""
    if nodes < 1:
        raise ValueError("there must be at least one node to route to")
    return 0 if nodes == 1 else _digest(prompt_text) % nodes


def worker_index(prompt_text: str, workers: int, nodes: int = 1) -> int:
    """The position, among the `workers` workers of its node (one of `nodes`), of the worker
    that plays this prompt's episodes."""
    if workers < 1:
        raise ValueError("there must be at least one worker to route to")
    if nodes < 1:
        raise ValueError("there must be at least one node to route to")
    if workers == 1:
        return 0
    return (_digest(prompt_text) // nodes) % workers


def tool_worker_for(prompt_text: str, nodes: Sequence[Sequence[str]]) -> str:
    """The base URL an episode of this prompt sends every tool call to: one worker of one
    node, from each node's workers' URLs."""
    workers = nodes[node_index(prompt_text, len(nodes))]
    return workers[worker_index(prompt_text, len(workers), len(nodes))]


def worker_for(prompt_text: str, urls: Sequence[str]) -> str:
    """The worker of one node's tool server (its workers' URLs) that plays this prompt."""
    return tool_worker_for(prompt_text, [urls])


def node_for(prompt_text: str, urls: Sequence[str]) -> str:
    """The URL, among one per node, of the node that plays this prompt: where a group's
    reward calls go (the node its tool calls went to, when every node has both servers)."""
    return urls[node_index(prompt_text, len(urls))]
