"""Which of a node's tool server workers plays an episode: picked by the rollout from the
prompt, so no proxy sits between the rollout and the tool server.

Why the prompt: a session is state in one worker (`click` opens a result of the session's own
latest `search`), so every call of an episode must reach the same worker; and the samples of a
GRPO group share their prompt and repeat each other's first searches, so sending the whole
group to one worker lets its cache (and its collapsing of identical calls in flight) pay for
those searches once. The hash is blake2b of the prompt's UTF-8 text, never Python's `hash()`,
which is salted per process: every rollout process must pick the same worker for a prompt.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def worker_index(prompt_text: str, workers: int) -> int:
    """The position, among `workers` workers, of the one that plays this prompt's episodes."""
    if workers < 1:
        raise ValueError("there must be at least one worker to route to")
    if workers == 1:
        return 0
    digest = hashlib.blake2b(prompt_text.encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "big") % workers


def worker_for(prompt_text: str, urls: Sequence[str]) -> str:
    """The base URL an episode of this prompt sends every tool call to (one URL: that one)."""
    return urls[worker_index(prompt_text, len(urls))]
