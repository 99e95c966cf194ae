"""Where a local run's episodes are played: in this process (`deepdive run`), or spread over the
nodes of a Slurm job, one rollout worker per node (deepdive.local.ray_rollouts).

Either way a batch is groups of samples of prompt rows, played through `generate_with_tool`
and scored through `reward_func` against one set of services: WORLD (this world's tool server
and the reward server: training and the held-out questions) or UNSEEN (another world's tool
server). Sample g * group_size + i is the same episode wherever it is played: its sampling seed
comes from its index, so a run's numbers do not depend on how its groups were spread.
"""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Protocol

from deepdive.local.config import LocalRunConfig
from deepdive.local.episodes import UNSEEN, WORLD, ServiceSet, rollout_batch
from deepdive.local.stack import engine_server, reward_server, tool_server
from deepdive.rollout_settings import RolloutSettings, rollout_args


class Rollouts(Protocol):
    def run(
        self,
        services: ServiceSet,
        rows: list[dict[str, Any]],
        group_size: int,
        params: dict[str, Any],
        seed: str,
    ) -> list[Any]:
        """Every sample of every row's group, in index order, with its reward."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The policy's new weights, for every engine that samples from it."""
        ...

    def node_counts(self) -> dict[int, int]:
        """Samples each node played in the last `run`."""
        ...


def settings_for(
    config: LocalRunConfig, sglang_url: str, tool_urls: tuple[str, ...], reward_url: str
) -> RolloutSettings:
    """The run's rollout knobs ([rollout]) against these services: one node's tool server
    (its workers' URLs) and reward server."""
    return RolloutSettings.of(
        config.rollout,
        sglang_url=sglang_url,
        tool_server_url=(tool_urls,),
        reward_server_url=(reward_url,),
        max_context_tokens=config.rollout.max_context_tokens,
    )


class InProcessRollouts:
    """The engine in this process, one `args` per set of services."""

    def __init__(self, engine: Any, args: dict[ServiceSet, Namespace]) -> None:
        self.engine = engine
        self.args = args
        self._count = 0

    def run(
        self,
        services: ServiceSet,
        rows: list[dict[str, Any]],
        group_size: int,
        params: dict[str, Any],
        seed: str,
    ) -> list[Any]:
        samples = asyncio.run(rollout_batch(self.args[services], rows, group_size, params, seed))
        self._count = len(samples)
        return samples

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state)

    def node_counts(self) -> dict[int, int]:
        return {0: self._count}


@contextmanager
def local_rollouts(
    config: LocalRunConfig,
    model: Any,
    tokenizer: Any,
    world: Path,
    unseen_world: Path | None,
    logs: Path,
    say: Any,
) -> Iterator[InProcessRollouts]:
    """The services of a one-machine run (tool and reward servers as child processes, the
    engine in this process) and the rollouts played against them."""
    with ExitStack() as stack:
        tools = stack.enter_context(tool_server(world, logs / "tool_server.log"))
        reward = stack.enter_context(reward_server(logs / "reward_server.log"))
        sglang, engine = stack.enter_context(
            engine_server(model, tokenizer, config.rollout.max_batch)
        )
        say(f"services: tools {' '.join(tools.urls)}, reward {reward.url}, engine {sglang}")
        args = {
            WORLD: rollout_args(
                settings_for(config, sglang, tuple(tools.urls), reward.url), tokenizer
            )
        }
        if unseen_world is not None:
            unseen = stack.enter_context(tool_server(unseen_world, logs / "unseen_tool_server.log"))
            say(f"unseen world: tools {' '.join(unseen.urls)}")
            args[UNSEEN] = rollout_args(
                settings_for(config, sglang, tuple(unseen.urls), reward.url), tokenizer
            )
        yield InProcessRollouts(engine, args)
