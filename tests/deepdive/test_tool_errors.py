"""A rollout whose tools fail stops the run, with the counts by kind and the upstream's own
words (deepdive.tool_errors): the real tool server on a fake Serper that fails 60 % of its
searches (fakes/upstream.py, HTTP 503), the rollout against a scripted fake SGLang, and the
run's stop taken where each backend takes it: slime's rollout log path for backend slime,
the GRPO step for backend local."""

from __future__ import annotations

import io
import logging
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from deepdive.generate import generate_with_tool
from deepdive.local.config import load_local_config
from deepdive.local.context import RunContext
from deepdive.local.episodes import WORLD
from deepdive.local.prompts import PromptSampler
from deepdive.local.rollouts import InProcessRollouts, settings_for
from deepdive.local.training import grpo_step
from deepdive.protocol import TOOL_ERROR_KINDS, format_tool_call
from deepdive.rollout_settings import ROLLOUT_LOG_FUNCTION_PATH, RolloutKnobs, rollout_args
from deepdive.run_paths import RunPaths
from deepdive.sample import LocalSample, SampleStatus
from deepdive.tool_errors import ToolsFailing, tool_error_counts
from fakes.sglang import FakeSGLang, ScriptedTurn
from fakes.upstream import create_app as fake_upstream
from services.base.errors import ConfigError
from services.client.http import UpstreamSettings
from services.client.retries import RetryPolicy
from services.serving.metrics import ServiceMetrics
from services.tool_server.app import create_app as create_tool_app
from services.tool_server.build import build_providers
from services.tool_server.config import ToolServerConfig
from services.tool_server.tools import ToolExecutor
from tests.helpers import make_args, new_sample, serve_in_thread, slime_log_rollout_data

episode_test = pytest.mark.usefixtures("rollout_clients")
FINISH = format_tool_call("finish", {"answer": "Ilse Varen"})
SEARCHES = 5  # per episode; with two episodes, 6 of the 10 searches fail


@pytest.fixture
def failing_tools(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The real tool server searching a fake Serper that fails 60 % of its calls; one
    attempt each, so each failed call is a failed tool call (retries only lower the share)."""
    monkeypatch.setenv("SERPER_API_KEY", "serper-key-0123456789")
    with serve_in_thread(fake_upstream(0.0, fail_share=0.6)) as serper:
        once = RetryPolicy(max_attempts=1)
        config = ToolServerConfig(
            search="serper",
            reader="jina",
            serper=UpstreamSettings(serper, retry=once),
            jina=UpstreamSettings(serper, retry=once),
            index_cache=False,
        )
        metrics = ServiceMetrics("tool")
        search, reader = build_providers(config, metrics)
        app = create_tool_app(ToolExecutor(config, search, reader, metrics), metrics)
        with serve_in_thread(app) as tools:
            yield tools


def searches(episode: int) -> list[ScriptedTurn]:
    """An episode of SEARCHES searches, each a query of its own (none served from the cache),
    then its answer."""
    return [
        *(
            ScriptedTurn(format_tool_call("search", {"query": f"orrery {episode} {turn}"}))
            for turn in range(SEARCHES)
        ),
        ScriptedTurn(FINISH),
    ]


async def play(services: dict[str, str], episodes: int, **extra: Any) -> list[LocalSample]:
    samples = []
    for episode in range(episodes):
        fake = FakeSGLang(searches(episode))
        with serve_in_thread(fake.app()) as sglang:
            args = make_args(sglang, services, **extra)
            samples.append(await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096}))
    return samples


def slime_args(services: dict[str, str], **extra: Any) -> Namespace:
    args = make_args("http://127.0.0.1:9", services, **extra)
    args.custom_rollout_log_function_path = ROLLOUT_LOG_FUNCTION_PATH
    return args


@pytest.mark.anyio
@episode_test
async def test_a_rollout_whose_searches_mostly_fail_stops_the_run_with_the_counts(
    failing_tools: str, services: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """It trained: every failed search an observation ("The tool server could not run
    search"), the episodes COMPLETED, nothing counted, nothing stopped."""
    tools = {**services, "tools": failing_tools}
    samples = await play(tools, episodes=2)
    assert [s.status for s in samples] == [SampleStatus.COMPLETED] * 2
    assert [s.metadata["deepdive"]["tool_errors"] for s in samples] == [
        {"upstream_unavailable": 3},
        {"upstream_unavailable": 3},
    ]
    with (
        caplog.at_level(logging.WARNING, logger="deepdive.tool_errors"),
        pytest.raises(ToolsFailing) as stopped,
    ):
        slime_log_rollout_data(4, slime_args(tools), samples, {})
    message = str(stopped.value)
    assert message.startswith(
        "rollout 4: 6 of 10 tool calls failed (60%), more than "
        "deepdive_max_tool_error_share = 0.5 allows; the tools failed, not the policy. "
        "By kind: upstream_unavailable 6. The tools said: [6x] serper: HTTP 503 after 1 attempts."
    )
    assert "slime.deepdive.max_tool_error_share" in message and "HTTPS_PROXY" in message
    [record] = [r for r in caplog.records if r.name == "deepdive.tool_errors"]
    assert "failed=6 calls=10 share=0.6 kinds=" in record.getMessage()


@pytest.mark.anyio
@episode_test
async def test_each_rollouts_tool_errors_go_into_its_metrics_by_kind(
    failing_tools: str, services: dict[str, str]
) -> None:
    tools = {**services, "tools": failing_tools}
    samples = await play(tools, episodes=2)
    logged = slime_log_rollout_data(1, slime_args(tools, max_tool_error_share=0.7), samples, {})
    assert logged["rollout/deepdive/tool_calls"] == 10
    assert logged["rollout/deepdive/tool_errors"] == 6
    assert logged["rollout/deepdive/tool_error_ratio"] == 0.6
    assert {kind: logged[f"rollout/deepdive/tool_errors/{kind}"] for kind in TOOL_ERROR_KINDS} == {
        **dict.fromkeys(TOOL_ERROR_KINDS, 0),
        "upstream_unavailable": 6,
    }
    healthy = await play(services, episodes=1)  # the offline world: no failure
    clean = slime_log_rollout_data(2, slime_args(services, max_tool_error_share=0.0), healthy, {})
    assert clean["rollout/deepdive/tool_errors"] == 0 and clean["rollout/deepdive/tool_calls"] == 5


@pytest.mark.anyio
@episode_test
async def test_a_tool_server_that_is_down_counts_as_kind_tool_server(
    services: dict[str, str],
) -> None:
    """Every search fails to reach the tool server (it answers its /health check, then goes
    away): the episode's calls are tool errors of kind tool_server, and the run stops."""
    with serve_in_thread(_health_only()) as tools:
        samples = await play({**services, "tools": tools}, episodes=1)
    assert samples[0].metadata["deepdive"]["tool_errors"] == {"tool_server": SEARCHES}
    with pytest.raises(ToolsFailing, match=r"5 of 5 tool calls failed .* tool_server 5"):
        slime_log_rollout_data(0, slime_args(services), samples, {})


def _health_only() -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        ok = scope["path"] == "/health"
        await send(
            {
                "type": "http.response.start",
                "status": 200 if ok else 503,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"status": "ok"}' if ok else b""})

    return app


def test_samples_without_statistics_count_nothing() -> None:
    odd = [
        LocalSample(metadata={"deepdive": {"tool_calls": {"search": "x"}, "tool_errors": []}}),
        LocalSample(metadata={"deepdive": "not a dict"}),
        LocalSample(metadata=None),  # type: ignore[arg-type]
        LocalSample(metadata={"deepdive": {"tool_calls": {"search": 2, "finish": 1}}}),
    ]
    counts = tool_error_counts(odd)
    assert (counts.calls, counts.failed, counts.share) == (2, 0, 0.0)


@pytest.mark.parametrize("share", [-0.1, 1.5, True, "half"])
def test_the_share_is_a_setting_from_0_to_1(share: Any) -> None:
    with pytest.raises(ConfigError, match="max_tool_error_share: expected a share from 0 to 1"):
        RolloutKnobs(max_tool_error_share=share)


def test_a_local_step_whose_searches_mostly_fail_stops_too(
    failing_tools: str, tmp_path: Path
) -> None:
    """`[local.rollout] max_tool_error_share` is the same rule for the local run: a GRPO step
    whose searches mostly failed stops before it trains on their observations."""
    from deepdive.local.model import train_tokenizer

    tokenizer = train_tokenizer(["who made the orrery search finish"] * 20, vocab_size=300)
    row = {"input_messages": [{"role": "user", "content": "Who made the orrery?"}], "label": "x"}
    overrides = [
        "grpo.prompts_per_step=1",
        "grpo.samples_per_prompt=2",
        "rollout.retries=0",
        "rollout.max_context_tokens=100000",
        "rollout.max_response_tokens=90000",
    ]
    config = load_local_config(None, overrides)
    run = RunContext(config, RunPaths(tmp_path), Console(file=io.StringIO()))
    # the two episodes play at once, taking turns from one script: ten searches, two answers
    script = [*searches(0)[:SEARCHES], *searches(1)[:SEARCHES], ScriptedTurn(FINISH)]
    with serve_in_thread(FakeSGLang([*script, ScriptedTurn(FINISH)]).app()) as sglang:
        settings = settings_for(config, sglang, (failing_tools,), "http://127.0.0.1:9")
        args = rollout_args(settings, tokenizer)
        rollouts = InProcessRollouts(engine=None, args={WORLD: args})
        with pytest.raises(ToolsFailing, match=r"^rollout 3: 6 of 10 tool calls failed") as error:
            grpo_step(run, 3, None, rollouts, [row], PromptSampler(1, 0))  # type: ignore[arg-type]
    assert "The limit is rollout.max_tool_error_share." in str(error.value)
