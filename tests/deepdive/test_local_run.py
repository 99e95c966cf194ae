"""`deepdive run` end to end on a tiny world: real service processes, the real engine, the real
rollout and reward, GRPO steps, checkpoints; killed with SIGKILL and resumed, it reaches exactly
the state an uninterrupted run reaches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

torch = pytest.importorskip("torch")

TINY = """
[run]
out = "{out}"
seed = 3
threads = 1
[world]
seed = 3
people = 12
cities = 6
guilds = 4
artifacts = 8
train_questions = 16
eval_questions = 4
sft_questions = 16
max_hops = 3
[model]
hidden = 32
layers = 1
heads = 2
vocab_size = 600
[rollout]
max_turns = 3
max_response_tokens = 48
max_context_tokens = 1536
max_batch = 1
temperature = 1.0
[warm_start]
epochs = 0.5
batch_size = 4
copy_steps = 3
copy_length = 8
copy_batch = 4
rename = 1.0
lr = 3e-3
observation_weight = 0.0
[grpo]
steps = 4
prompts_per_step = 2
samples_per_prompt = 4
updates_per_step = 2
kl_coef = 0.05
lr = 1e-3
per_token_loss = false
[checkpoint]
every = 2
[eval]
questions = 2
unseen_questions = 2
temperature = 0.0
samples = 1
"""
TIMINGS = {"rollout_s", "update_s", "sync_s"}


def deepdive_run(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "slurm.cli", "run", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def write_config(tmp_path: Path, name: str, extra: str = "") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(TINY.format(out=tmp_path / name) + extra)
    return path


def rows(out: Path) -> dict[int, dict[str, Any]]:
    lines = (out / "logs" / "metrics.jsonl").read_bytes().splitlines()
    return {
        row["step"]: {k: v for k, v in row.items() if k not in TIMINGS}
        for row in map(orjson.loads, lines)
    }


def weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def titles(world: Path) -> set[str]:
    return {
        orjson.loads(line)["title"] for line in (world / "corpus.jsonl").read_bytes().splitlines()
    }


def service_urls(out: Path) -> list[str]:
    urls = []
    for name in ("tool_server.log", "unseen_tool_server.log", "reward_server.log"):
        for line in (out / "logs" / name).read_text().splitlines():
            if "listening on " in line:
                urls.append(line.split("listening on ")[1].split()[0])
    return urls


def recorded(out: Path) -> None:
    """Every step's episodes (2 prompts x 4 samples: the default 4 groups take them all) and
    every evaluation episode, in files the format's reader reads; the agent statistics per
    step in the metrics (TensorBoard's too) and in stats.jsonl."""
    from deepdive.trajectory_format import read_episodes, step_files

    folder = out / "trajectories"
    steps = step_files(folder)
    assert [step for step, _ in steps] == [1, 2, 3, 4]
    for step, path in steps:
        episodes = list(read_episodes(path))
        assert len(episodes) == 8 and {e.step for e in episodes} == {step}
        assert {(e.group, e.sample) for e in episodes} == {(g, i) for g in (0, 1) for i in range(4)}
        assert all(e.question and e.turns and e.label for e in episodes)
        assert sum(len(e.turns) for e in episodes) == sum(
            1 for e in episodes for t in e.turns if t.text
        )
    evals = {step: list(read_episodes(path)) for step, path in step_files(folder / "eval")}
    assert sorted(evals) == [0, 4]
    for episodes in evals.values():
        assert sorted(e.eval_set or "" for e in episodes) == ["held-out"] * 2 + ["unseen"] * 2
    stats = [orjson.loads(line) for line in (folder / "stats.jsonl").read_bytes().splitlines()]
    assert [(row["step"], row["evaluation"]) for row in stats] == [
        (0, True),
        (1, False),
        (2, False),
        (3, False),
        (4, False),
        (4, True),
    ]
    for row in rows(out).values():
        assert 0.0 <= row["agent/finish_rate"] <= 1.0 and row["agent/turns"] >= 1


@pytest.mark.slow
def test_kill_and_resume_reaches_the_uninterrupted_state(tmp_path: Path) -> None:
    straight = deepdive_run(write_config(tmp_path, "straight"))
    stdout, stderr = straight.communicate(timeout=600)
    assert straight.returncode == 0, stderr
    out = tmp_path / "straight"
    summary = orjson.loads((out / "summary.json").read_bytes())
    assert summary["grpo_steps"] == 4 and summary["eval_questions"] == 2
    assert set(summary["time_split_s"]) == TIMINGS
    for name in ("metrics", "final_model", "plot", "summary", "checkpoints"):
        assert Path(summary["paths"][name]).exists()
    assert (out / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    assert "held-out reward after GRPO" in stdout  # the closing table, on standard output
    assert sorted(rows(out)) == [1, 2, 3, 4]
    assert summary["warm_start"]["copy_steps"] == 3 and summary["warm_start"]["steps"] == 2
    # the unseen world: its own pages, none of this world's, scored before and after GRPO
    assert summary["unseen_questions"] == 2
    for key in ("unseen_reward_before", "unseen_reward_after"):
        assert 0.0 <= summary[key] <= 1.0
    assert not titles(out / "world") & titles(out / "unseen_world")
    assert "unseen reward after GRPO" in stderr
    assert list((out / "logs" / "tensorboard").glob("events.out.tfevents.*"))
    recorded(out)

    config = write_config(tmp_path, "killed")
    killed_out = tmp_path / "killed"
    victim = deepdive_run(config)
    marker = killed_out / "checkpoints" / "step-000002" / "meta.json"
    deadline = time.monotonic() + 600
    while not marker.exists():
        assert victim.poll() is None, victim.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    assert not (killed_out / "checkpoints" / "step-000004").exists()
    assert not (killed_out / "summary.json").exists()
    time.sleep(1)  # the services get SIGTERM from the kernel when their parent dies
    for url in service_urls(killed_out):
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)

    resumed = deepdive_run(config)
    _, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr
    assert "resumed from" in stderr and "at step 2" in stderr
    assert rows(killed_out) == rows(out)  # steps 3 and 4 redone exactly, 1 and 2 kept once
    resumed_summary = orjson.loads((killed_out / "summary.json").read_bytes())
    for key in ("eval_reward_before", "unseen_reward_before", "unseen_reward_after"):
        assert resumed_summary[key] == summary[key], (
            key
        )  # the before values came from the checkpoint
    expected, actual = weights(out / "final_model"), weights(killed_out / "final_model")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name

    changed = write_config(tmp_path, "killed")
    changed.write_text(changed.read_text().replace("kl_coef = 0.05", "kl_coef = 0.1"))
    refused = subprocess.run(
        [sys.executable, "-m", "slurm.cli", "run", str(changed)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2
    assert "grpo.kl_coef changed" in refused.stderr and "choose another run.out" in refused.stderr
    fresh = (
        changed.read_text()
        .replace("kl_coef = 0.1", "kl_coef = 0.05")
        .replace("[run]\n", "[run]\nresume = false\n")
    )
    changed.write_text(fresh)
    refused = subprocess.run(
        [sys.executable, "-m", "slurm.cli", "run", str(changed)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "run.resume = false" in refused.stderr
    assert os.path.exists(killed_out / "checkpoints" / "step-000004")  # nothing was overwritten


@pytest.mark.slow
def test_a_kill_during_the_first_evaluation_resumes_after_the_warm_start(tmp_path: Path) -> None:
    """The warm start is checkpointed before the evaluation that follows it: an attempt that
    dies there (a requeue on a slow node) continues with the evaluation, not a second warm
    start, and reaches what an uninterrupted run reaches."""
    longer = (  # an evaluation long enough to be killed in
        TINY.replace("samples = 1\n", "samples = 12\n").replace("steps = 4\n", "steps = 1\n")
    )
    straight_config = tmp_path / "straight.toml"
    straight_config.write_text(longer.format(out=tmp_path / "straight"))
    straight = deepdive_run(straight_config)
    _, straight_log = straight.communicate(timeout=600)
    assert straight.returncode == 0, straight_log

    config = tmp_path / "killed.toml"
    config.write_text(longer.format(out=tmp_path / "killed"))
    victim = deepdive_run(config)
    marker = tmp_path / "killed" / "checkpoints" / "step-000000" / "meta.json"
    deadline = time.monotonic() + 600
    while not marker.exists():
        assert victim.poll() is None, victim.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    _, killed_log = victim.communicate(timeout=60)
    assert "reward after the warm start" not in killed_log  # killed inside that evaluation

    resumed = deepdive_run(config)
    _, resumed_log = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, resumed_log
    assert "at step 0" in resumed_log
    assert "copy warm-up" not in resumed_log and "warm start" not in resumed_log.replace(
        "after the warm start", ""
    )
    out, killed_out = tmp_path / "straight", tmp_path / "killed"
    assert rows(killed_out) == rows(out)
    summary = orjson.loads((out / "summary.json").read_bytes())
    resumed_summary = orjson.loads((killed_out / "summary.json").read_bytes())
    for key in ("eval_reward_before", "eval_reward_after"):
        assert resumed_summary[key] == summary[key], key
    for summaries in (resumed_summary, summary):
        summaries["warm_start"].pop("seconds")
    assert resumed_summary["warm_start"] == summary["warm_start"]  # from the checkpoint
    expected, actual = weights(out / "final_model"), weights(killed_out / "final_model")
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
