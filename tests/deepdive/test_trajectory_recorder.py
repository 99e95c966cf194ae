"""Episodes recorded by the rollout log functions, through slime's own log path (tests/helpers.py
`slime_log_rollout_data`, `slime_log_eval_rollout_data`: slime/observability/rollout_metrics.py
at 624b824, lines 256-260 and 223-227, called in RolloutManager.generate and .eval,
slime/ray/rollout.py, lines 506 and 528, the process that runs the generate hook): real
episodes against the real tool and reward servers and a scripted SGLang, the files read back
with the format's reader."""

from __future__ import annotations

import gzip
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from deepdive.agent_stats import agent_statistics
from deepdive.generate import generate_with_tool
from deepdive.protocol import format_tool_call
from deepdive.reward import reward_func
from deepdive.rollout_settings import (
    EVAL_LOG_FUNCTION_PATH,
    ROLLOUT_LOG_FUNCTION_PATH,
    TRAJECTORY_DIR_ARG,
)
from deepdive.sample import LocalSample, SampleStatus
from deepdive.trajectory_format import (
    OBSERVATION_CHARS,
    encode_line,
    read_episodes,
    read_step,
    step_files,
)
from deepdive.trajectory_recorder import (
    EVAL_FOLDER,
    STATS_FILE,
    episode_record,
    prune,
    record_step,
    recorder_for,
    snapshot,
)
from fakes.sglang import FakeSGLang, ScriptedTurn
from services.base.logs import register_secret
from tests import hostile
from tests.helpers import (
    make_args,
    new_sample,
    serve_in_thread,
    slime_log_eval_rollout_data,
    slime_log_rollout_data,
)

episode_test = pytest.mark.usefixtures("rollout_clients")
FINISH = format_tool_call("finish", {"answer": "Ilse Varen"})
SCRIPT = [
    format_tool_call("search", {"query": "silver orrery Haldor"}),
    format_tool_call("click", {"link_id": 1}),
    "I think I know.\n" + FINISH,
]


async def play(services: dict[str, str], groups: int, group_size: int = 2) -> list[LocalSample]:
    samples = []
    for group in range(groups):
        for index in range(group_size):
            fake = FakeSGLang([ScriptedTurn(turn) for turn in SCRIPT])
            with serve_in_thread(fake.app()) as sglang:
                args = make_args(sglang, services)
                sample = new_sample()
                sample.group_index, sample.index = group, group * group_size + index
                samples.append(await generate_with_tool(args, sample, {"max_new_tokens": 4096}))
    rewards = await reward_func(args, samples)
    for sample, reward in zip(samples, rewards, strict=True):
        sample.reward = reward
    return samples


def slime_args(services: dict[str, str], folder: Path, **extra: Any) -> Namespace:
    args = make_args("http://127.0.0.1:9", services, **extra)
    args.custom_rollout_log_function_path = ROLLOUT_LOG_FUNCTION_PATH
    args.custom_eval_rollout_log_function_path = EVAL_LOG_FUNCTION_PATH
    setattr(args, TRAJECTORY_DIR_ARG, str(folder))
    return args


def written(folder: Path) -> None:
    recorder_for(folder, 2**30).flush()


@pytest.mark.anyio
@episode_test
async def test_slimes_log_path_records_a_sample_of_the_steps_episodes(
    services: dict[str, str], tmp_path: Path
) -> None:
    folder = tmp_path / "trajectories"
    samples = await play(services, groups=3)
    args = slime_args(services, folder, trajectory_groups=2)
    metrics = slime_log_rollout_data(7, args, samples, {"rollout/extra": 1.0})
    written(folder)
    records = read_step(folder, 7)
    assert [(r.group, r.sample) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    episode = records[0]
    assert episode.status == "completed" and episode.reward == 1.0
    assert episode.label == "Ilse Varen" and episode.answer == "Ilse Varen"
    assert episode.question and episode.question in samples[0].prompt
    assert [t.call.name if t.call else None for t in episode.turns] == ["search", "click", "finish"]
    assert episode.turns[0].call is not None
    assert episode.turns[0].call.arguments["query"] == "silver orrery Haldor"
    search = episode.turns[0]
    assert search.observation is not None and search.observation_chars >= len(search.observation)
    assert len(search.observation) <= OBSERVATION_CHARS and search.observation_tokens > 0
    assert episode.turns[2].observation is None and episode.turns[2].text.startswith("I think")
    # the turns are the response, cut where the hook's turn log says
    whole = "".join(t.text + (t.observation or "") for t in episode.turns)
    if all(t.observation_chars == len(t.observation or "") for t in episode.turns):
        assert whole == samples[0].response
    assert episode.response_tokens == samples[0].response_length
    assert episode.tool_calls == {"search": 1, "click": 1, "finish": 1}
    # the agent statistics joined slime's rollout metrics (what it logs next) and stats.jsonl
    assert metrics["rollout/deepdive/agent/tool_calls/search"] == 1.0
    assert metrics["rollout/deepdive/agent/finish_rate"] == 1.0
    assert metrics["rollout/deepdive/agent/reward_by_searches/1"] == 1.0
    assert metrics["rollout/extra"] == 1.0
    line = (folder / STATS_FILE).read_text().splitlines()[-1]
    assert '"step":7' in line and '"tool_calls/click":1.0' in line


@pytest.mark.anyio
@episode_test
async def test_an_evaluation_records_every_episode_of_every_set(
    services: dict[str, str], tmp_path: Path
) -> None:
    folder = tmp_path / "trajectories"
    samples = await play(services, groups=3)
    data = {
        name: {"samples": part, "rewards": [s.reward for s in part]}
        for name, part in (("aime", samples[:4]), ("hle", samples[4:]))
    }
    slime_log_eval_rollout_data(3, slime_args(services, folder, trajectory_groups=1), data)
    written(folder)
    records = read_step(folder / EVAL_FOLDER, 3)
    assert [r.eval_set for r in records] == ["aime"] * 4 + ["hle"] * 2
    assert all(r.evaluation for r in records)
    assert not step_files(folder)  # no training step was recorded


@pytest.mark.anyio
@episode_test
async def test_secrets_never_reach_the_files(services: dict[str, str], tmp_path: Path) -> None:
    secret = "sk-live-trajectory-secret-0123456789"
    register_secret(secret)
    [sample] = await play(services, groups=1, group_size=1)
    sample.label = f"the key is {secret}"
    sample.response = sample.response.replace("orrery", secret)
    folder = tmp_path / "trajectories"
    record_step(folder, 1, [sample], groups=None, max_bytes=2**30)
    written(folder)
    [path] = [p for _, p in step_files(folder)]
    assert secret.encode() not in gzip.decompress(path.read_bytes())
    assert "***" in (read_step(folder, 1)[0].label or "")


def test_the_oldest_steps_go_past_the_budget(tmp_path: Path) -> None:
    folder = tmp_path / "trajectories"
    sample = LocalSample(group_index=0, prompt="q", response="x" * 5000, status=SampleStatus.FAILED)
    for step in range(1, 6):
        record_step(folder, step, [sample], groups=None, max_bytes=10**9)
        record_step(
            folder, step, {"held-out": [sample]}, groups=None, max_bytes=10**9, evaluation=True
        )
        written(folder)  # 8 steps queued at most: a writer that far behind drops the next
    assert [s for s, _ in step_files(folder)] == [1, 2, 3, 4, 5]
    every = sorted(step_files(folder) + step_files(folder / EVAL_FOLDER))
    removed = prune(folder, sum(path.stat().st_size for _, path in every[-3:]))
    kept = step_files(folder) + step_files(folder / EVAL_FOLDER)
    assert len(kept) == 3 and {s for s, _ in kept} == {4, 5}
    assert len(removed) == 7
    assert prune(folder, 0) and [s for s, _ in step_files(folder)] == [5]  # the newest stays


def test_no_sample_is_recorded_with_groups_0(tmp_path: Path) -> None:
    assert record_step(tmp_path, 1, [new_sample()], groups=0, max_bytes=1) is None


sample_turn_logs = st.lists(
    st.dictionaries(
        st.sampled_from(
            ["chars", "tokens", "call", "call_error", "obs_chars", "obs_tokens", "tool_error"]
        ),
        hostile.json_values,
        max_size=7,
    )
    | hostile.json_values,
    max_size=5,
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    response=hostile.unicode_text,
    label=hostile.json_values,
    turn_log=sample_turn_logs | hostile.json_values,
    details=hostile.json_values,
    reward=hostile.json_values,
    prompt=hostile.json_values,
)
def test_nothing_a_model_writes_raises_out_of_a_record(
    tmp_path_factory: pytest.TempPathFactory,
    response: str,
    label: Any,
    turn_log: Any,
    details: Any,
    reward: Any,
    prompt: Any,
) -> None:
    sample = LocalSample(
        group_index=0,
        prompt=prompt,
        label=label,
        response=response,
        reward=reward,
        status=SampleStatus.TRUNCATED,
        metadata={"deepdive": {"turn_log": turn_log, "error": label}, "reward_details": details},
    )
    record = episode_record(snapshot(sample, 0), 1)
    path = tmp_path_factory.mktemp("records") / "results.jsonl"
    path.write_bytes(encode_line(record))
    [back] = list(read_episodes(path))
    assert back.status == "truncated" and back.step == 1


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(
    stats=st.dictionaries(
        st.sampled_from(["tool_calls", "turns", "turn_log", "error"]), hostile.json_values
    )
    | hostile.json_values,
    reward=hostile.json_values,
    length=hostile.json_values,
)
@example(stats={"turn_log": 5, "tool_calls": {"search": 2}}, reward=None, length=3)
def test_no_sample_raises_out_of_the_agent_statistics(stats: Any, reward: Any, length: Any) -> None:
    sample = LocalSample(group_index=0, reward=reward, metadata={"deepdive": stats})
    sample.response_length = length
    found = agent_statistics([sample, new_sample()])
    assert found["turns"] >= 0 and 0.0 <= found["finish_rate"] <= 1.0
