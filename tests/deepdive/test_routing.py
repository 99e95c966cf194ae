"""Which tool server worker of which node plays an episode (deepdive.routing): the same in every
process, spread evenly over the nodes and their workers, a group's reward on its tool node, the
one URL when there is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from deepdive.routing import node_for, node_index, tool_worker_for, worker_for, worker_index

PROMPTS = [
    f"<|im_start|>user\nQuestion {n}: who built orrery {n * 7}?<|im_end|>" for n in range(64)
]
URLS = ["http://127.0.0.1:20010", "http://127.0.0.1:20011", "http://127.0.0.1:20012"]
NODES = [
    ["http://10.0.0.1:20010", "http://10.0.0.1:20011", "http://10.0.0.1:20012"],
    ["http://10.0.0.2:20010", "http://10.0.0.2:20011", "http://10.0.0.2:20012"],
]
REWARDS = ["http://10.0.0.1:20020", "http://10.0.0.2:20020"]


def test_the_pick_is_the_same_in_every_process() -> None:
    """Python's hash() is salted per process; slime's rollout actors must agree on a prompt."""
    code = (
        "import json, sys\nfrom deepdive.routing import tool_worker_for, worker_for\n"
        "prompts, urls, nodes = json.load(sys.stdin)\n"
        "print(json.dumps([[worker_for(p, urls), tool_worker_for(p, nodes)] for p in prompts]))\n"
    )
    picks = []
    for seed in ("0", "1", "random"):
        result = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps([PROMPTS, URLS, NODES]),
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        picks.append(json.loads(result.stdout))
    here = [[worker_for(p, URLS), tool_worker_for(p, NODES)] for p in PROMPTS]
    assert picks == [here, here, here]
    assert worker_index("fixed prompt", 4) == 1  # pinned: a change would re-route every run
    assert (node_index("fixed prompt", 2), worker_index("fixed prompt", 4, 2)) == (1, 2)


@pytest.mark.parametrize("workers", [2, 3, 8])
def test_many_prompts_spread_evenly(workers: int) -> None:
    counts = Counter(worker_index(f"prompt number {n}", workers) for n in range(8000))
    expected = 8000 / workers
    assert set(counts) == set(range(workers))
    assert all(abs(count - expected) < 0.1 * expected for count in counts.values()), counts


def test_one_url_is_that_url_and_a_group_shares_its_worker() -> None:
    for text in ("", "x", "ünïcödé", "\udcff lone surrogate", *PROMPTS):
        assert worker_for(text, ["http://only:1"]) == "http://only:1"
        assert len({worker_for(text, URLS) for _ in range(8)}) == 1  # 8 samples, one worker


def test_no_worker_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one worker"):
        worker_for("x", [])


def test_over_nodes_every_worker_of_every_node_gets_an_even_share() -> None:
    """The node is the hash's remainder, the worker its quotient's: no pair is favoured."""
    counts = Counter(tool_worker_for(f"prompt number {n}", NODES) for n in range(12000))
    every = [url for node in NODES for url in node]
    assert set(counts) == set(every)
    assert all(abs(count - 2000) < 200 for count in counts.values()), counts


def test_a_groups_reward_goes_to_the_node_its_tool_calls_went_to() -> None:
    for text in PROMPTS:
        node = node_index(text, 2)
        assert tool_worker_for(text, NODES) in NODES[node]
        assert node_for(text, REWARDS) == REWARDS[node]
        assert len({tool_worker_for(text, NODES) for _ in range(8)}) == 1  # the group's one


def test_one_node_routes_as_the_within_node_routing_did() -> None:
    """`deepdive eval` and the local backend hand the rollout one node: the same pick."""
    for text in PROMPTS:
        assert (
            tool_worker_for(text, [URLS]) == URLS[worker_index(text, 3)] == worker_for(text, URLS)
        )
        assert node_for(text, ["http://only:1"]) == "http://only:1"


def test_no_node_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        tool_worker_for("x", [])
    with pytest.raises(ValueError, match="at least one worker"):
        second = next(text for text in PROMPTS if node_index(text, 2) == 1)
        tool_worker_for(second, [["http://a:1"], []])  # a node without workers, when picked
