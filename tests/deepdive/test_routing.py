"""Which tool server worker plays an episode (deepdive.routing): the same in every process,
spread evenly over the workers, the one URL when there is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from deepdive.routing import worker_for, worker_index

PROMPTS = [
    f"<|im_start|>user\nQuestion {n}: who built orrery {n * 7}?<|im_end|>" for n in range(64)
]
URLS = ["http://127.0.0.1:20010", "http://127.0.0.1:20011", "http://127.0.0.1:20012"]


def test_the_pick_is_the_same_in_every_process() -> None:
    """Python's hash() is salted per process; slime's rollout actors must agree on a prompt."""
    code = (
        "import json, sys\nfrom deepdive.routing import worker_for\n"
        "prompts, urls = json.load(sys.stdin)\n"
        "print(json.dumps([worker_for(p, urls) for p in prompts]))\n"
    )
    picks = []
    for seed in ("0", "1", "random"):
        result = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps([PROMPTS, URLS]),
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        picks.append(json.loads(result.stdout))
    here = [worker_for(p, URLS) for p in PROMPTS]
    assert picks == [here, here, here]
    assert worker_index("fixed prompt", 4) == 1  # pinned: a change would re-route every run


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
