"""A wrong tool or reward server URL is loud: checked once via /health before first use, 404/405
during calls stop the run naming the setting, DeepDive's endpoint spellings work. Real servers on
loopback (ours, the benchmark's fake, a look-alike that is not ours); requests counted on the
server side."""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import pytest

from deepdive.generate import generate_with_tool
from deepdive.protocol import format_tool_call
from deepdive.reward import reward_func
from deepdive.sample import LocalSample, SampleStatus
from fakes.look_alike import look_alike_app
from fakes.rollout_servers import create_app as fast_fakes
from fakes.sglang import FakeSGLang, ScriptedTurn
from services.base.errors import ConfigError
from services.serving.serve import bind, start_server_thread
from tests.helpers import counting, make_args, new_sample, reward_app, serve_in_thread, tool_app

pytestmark = pytest.mark.usefixtures("rollout_clients")

SEARCH = format_tool_call("search", {"query": "silver orrery Haldor"})
FINISH = format_tool_call("finish", {"answer": "Ilse Varen"})
EPISODES = 200  # concurrent first episodes, as a rollout step starts them
TOOL_KEY = r"deepdive_tool_server_url=http://127\.0\.0\.1:\d+"
REWARD_KEY = r"deepdive_reward_server_url=http://127\.0\.0\.1:\d+"


async def episode(services: dict[str, str], script: list[str] | None = None) -> LocalSample:
    fake = FakeSGLang([ScriptedTurn(t) for t in script or [SEARCH, FINISH]])
    with serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, services)
        sample: LocalSample = await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096})
    return sample


async def finished(services: dict[str, str]) -> tuple[LocalSample, Any]:
    sample = await episode(services, [FINISH])
    return sample, make_args("http://127.0.0.1:9", services)


@pytest.mark.anyio
@pytest.mark.parametrize("reward_endpoint", ["/evaluate", "/evaluate/batch"])
async def test_deepdive_full_endpoint_urls_work(
    services: dict[str, str], reward_endpoint: str
) -> None:
    full = {"tools": services["tools"] + "/tool", "reward": services["reward"] + reward_endpoint}
    sample = await episode(full)
    assert sample.status is SampleStatus.COMPLETED
    assert "Orrery of Haldor" in sample.response
    assert await reward_func(make_args("http://127.0.0.1:9", full), sample) == 1.0


@pytest.mark.anyio
async def test_a_tool_server_url_that_404s_stops_the_rollout_naming_the_key(
    services: dict[str, str],
) -> None:
    with pytest.raises(ConfigError, match=TOOL_KEY + "/wrong: .*HTTP 404") as raised:
        await episode({**services, "tools": services["tools"] + "/wrong"})
    assert "such as http://host:8700, where POST /tool lives" in raised.value.message


@pytest.mark.anyio
async def test_a_reward_server_url_that_404s_stops_reward_func_naming_the_key(
    services: dict[str, str],
) -> None:
    sample, _ = await finished(services)
    wrong = make_args("http://127.0.0.1:9", {**services, "reward": services["reward"] + "/wrong"})
    with pytest.raises(ConfigError, match=REWARD_KEY + "/wrong: .*HTTP 404") as raised:
        await reward_func(wrong, sample)
    assert "/evaluate and /evaluate/batch" in raised.value.message
    with pytest.raises(ConfigError, match=REWARD_KEY):  # and again, for every later call
        await reward_func(wrong, [sample, sample])


@pytest.mark.anyio
async def test_swapped_urls_pass_health_but_their_first_call_stops_the_run(
    services: dict[str, str],
) -> None:
    # Both answer our /health; POST /tool at the reward server, /evaluate/batch at the tool
    # server answer 404, read as a wrong URL during the call.
    swapped = {"tools": services["reward"], "reward": services["tools"]}
    with pytest.raises(ConfigError, match=TOOL_KEY + ": HTTP 404 .*tool server is not there"):
        await episode(swapped)
    sample, _ = await finished(services)
    with pytest.raises(ConfigError, match=REWARD_KEY + ": HTTP 404"):
        await reward_func(make_args("http://127.0.0.1:9", swapped), sample)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("health", "found"),
    [
        (orjson.dumps({"healthy": True}), 'answered HTTP 200 but not {"status": "ok"}'),
        (b"<html>It works!</html>", 'answered HTTP 200 but not {"status": "ok"}'),
        (None, "HTTP 404"),  # no /health at all
    ],
)
async def test_a_server_that_is_not_ours_is_refused(
    services: dict[str, str], health: bytes | None, found: str
) -> None:
    with serve_in_thread(look_alike_app(health)) as other:
        with pytest.raises(ConfigError, match=TOOL_KEY) as raised:
            await episode({**services, "tools": other})
        assert found in raised.value.message
        sample, _ = await finished(services)
        with pytest.raises(ConfigError, match=REWARD_KEY) as raised:
            await reward_func(
                make_args("http://127.0.0.1:9", {**services, "reward": other}), sample
            )
        assert found in raised.value.message


@pytest.mark.anyio
async def test_a_refused_health_check_is_a_wrong_url_too(
    corpus_file: Path, tmp_path: Path, services: dict[str, str]
) -> None:
    # With a token, our middleware answers 401 on every path but /health itself: a wrong path
    # is a 401 there, never a 404, and only the check can tell.
    tools = tool_app(corpus_file, tmp_path, token="secret")
    with (
        serve_in_thread(tools) as base,
        pytest.raises(ConfigError, match=TOOL_KEY + "/wrong: GET /health was refused"),
    ):
        await episode({**services, "tools": base + "/wrong"})


@pytest.mark.anyio
async def test_hundreds_of_first_episodes_share_one_health_check() -> None:
    counts: Counter[str] = Counter()
    with serve_in_thread(counting(fast_fakes(turns=2), counts)) as base:
        args = make_args(base, {"tools": base, "reward": base})
        for _ in range(2):  # the second step is checked already
            done = await asyncio.gather(
                *(generate_with_tool(args, new_sample(), {}) for _ in range(EPISODES))
            )
            assert all(s.status is SampleStatus.COMPLETED for s in done)
    assert counts["GET /health"] == 1
    assert counts["POST /tool"] == 2 * 2 * EPISODES  # a search and close_session each


@pytest.mark.anyio
async def test_hundreds_of_first_rewards_share_one_health_check(services: dict[str, str]) -> None:
    sample, _ = await finished(services)
    counts: Counter[str] = Counter()
    with serve_in_thread(counting(reward_app(), counts)) as reward:
        args = make_args("http://127.0.0.1:9", {**services, "reward": reward})
        rewards = await asyncio.gather(*(reward_func(args, [sample]) for _ in range(EPISODES)))
    assert rewards == [[1.0]] * EPISODES
    assert (counts["GET /health"], counts["POST /evaluate/batch"]) == (1, EPISODES)


@pytest.mark.anyio
async def test_hundreds_of_first_episodes_at_a_wrong_url_share_one_probe_and_all_stop() -> None:
    counts: Counter[str] = Counter()
    with serve_in_thread(counting(fast_fakes(turns=2), counts)) as base:
        args = make_args(base, {"tools": base + "/wrong", "reward": base})
        done = await asyncio.gather(
            *(generate_with_tool(args, new_sample(), {}) for _ in range(EPISODES)),
            return_exceptions=True,
        )
    assert all(isinstance(d, ConfigError) for d in done)
    assert counts["GET /wrong/health"] == 1 and counts["POST /wrong/tool"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("path", ["", "/wrong"])
async def test_a_server_not_up_yet_is_checked_once_it_answers(
    corpus_file: Path, tmp_path: Path, services: dict[str, str], path: str
) -> None:
    # Not up at the first call: no configuration error, the call's usual observation. Up for
    # the second: checked then, once; at a wrong path that check stops the run.
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    counts: Counter[str] = Counter()
    stack = ExitStack()

    def start_tools_on_second_turn(count: int) -> None:
        if count == 2:
            app = counting(tool_app(corpus_file, tmp_path), counts)
            stack.callback(start_server_thread(app, bind("127.0.0.1", port)))

    fake = FakeSGLang(
        [ScriptedTurn(t) for t in (SEARCH, SEARCH, FINISH)], on_request=start_tools_on_second_turn
    )
    with stack, serve_in_thread(fake.app()) as sglang:
        args = make_args(sglang, {**services, "tools": f"http://127.0.0.1:{port}{path}"})
        if path:
            with pytest.raises(ConfigError, match=TOOL_KEY + "/wrong"):
                await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096})
        else:
            sample = await generate_with_tool(args, new_sample(), {"max_new_tokens": 4096})
            first = sample.response.split("<observation>")[1]
            assert "The tool server could not run search" in first
            assert sample.status is SampleStatus.COMPLETED
    assert counts[f"GET {path}/health"] == 1


@pytest.mark.anyio
async def test_no_url_credentials_in_the_error(services: dict[str, str]) -> None:
    tools = services["tools"].replace("http://", "http://user:hunter2@") + "/wrong"
    with pytest.raises(ConfigError) as raised:
        await episode({**services, "tools": tools})
    assert "hunter2" not in raised.value.message and "***@127.0.0.1" in raised.value.message
