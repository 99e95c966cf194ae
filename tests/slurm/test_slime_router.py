"""slime's router keeps an episode's turns on one SGLang engine, so each turn reuses the KV cache
of the turns before it. Decided per policy from sglang-router 0.3.2, the version slime's image
carries (docker/Dockerfile:111 at slime 624b824 installs zhuzilin/sgl-router's fork
v0.3.2-9daabcd, which could not be read here; read instead: its base, the 0.3.2 release of
lightseekorg/smg, commit c7f9bf9f5 "[smg] release 0.3.2", 2026-01-15):

- `cache_aware`, slime's default: `select_worker` (src/policies/cache_aware.rs:351-440) never
  reads the request's headers. It follows the longest cached prefix of the request's text (our
  token-in /generate: the input ids joined, src/protocols/generate.rs:214-234) only while the
  engines are balanced; "imbalanced" is `max - min > balance_abs_threshold && max > rel x min`
  (cache_aware.rs:370-372), and then every request goes to the shortest queue. With
  `--router-balance-abs-threshold 0` (2a5d2bd's argv) any engine with one request fewer than
  another makes the system imbalanced: turns leave their engine and re-prefill their context.
  slime's own docs say as much (docs/en/get_started/usage.md:149).
- `manual`: routes by the `X-SMG-Routing-Key` header (src/routers/header_utils.rs:9,
  src/policies/manual.rs:194-207): a key seen before goes to the engine it was given while that
  engine is healthy (manual.rs:161-181), a new key by the assignment mode, `min_load` the engine
  with the fewest requests in flight (manual.rs:152-157, 290-291). Our rollout sends the
  episode's session id in that header on every turn (deepdive/generate.py, `generate_turn`).
- `consistent_hashing`, which slime's docs recommend for multi-turn agents
  (docs/en/advanced/sglang-config.md:299-316), exists in 0.3.2's Rust (src/policies/
  consistent_hashing.rs) but not among its command line's choices
  (bindings/python/src/sglang_router/router_args.py:245-250: random, round_robin, cache_aware,
  power_of_two, manual), so slime's parser refuses it.

So the recipe passes `--router-policy manual --router-assignment-mode min_load` and no balance
threshold; `cache_aware` gets slime's threshold (10, slime/backends/sglang_utils/arguments.py:46)
unless the config says otherwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.base.errors import ConfigError
from slurm.backends.slime.args import slime_arguments
from slurm.backends.slime.checks import check_slime
from slurm.backends.slime.replay import replay
from tests.helpers import slime_recipe as recipe


def argv(world: dict[str, Path], *extra: str) -> list[str]:
    return slime_arguments(recipe(world, *extra), Path("/x.yaml")).arguments()


def test_the_recipe_keeps_each_episode_on_the_engine_it_started_on(
    world: dict[str, Path],
) -> None:
    """On 2a5d2bd: cache_aware with --router-balance-abs-threshold 0, and the header ignored."""
    arguments = argv(world)
    start = arguments.index("--router-policy")
    assert arguments[start : start + 4] == [
        "--router-policy", "manual", "--router-assignment-mode", "min_load",
    ]  # fmt: skip
    assert "--router-balance-abs-threshold" not in arguments  # cache_aware's alone
    namespace = replay(arguments).namespace  # as slime's parser reads it
    assert (namespace["router_policy"], namespace["router_assignment_mode"]) == (
        "manual",
        "min_load",
    )
    check_slime(recipe(world))


def test_cache_aware_keeps_slimes_balance_threshold_never_zero_by_default(
    world: dict[str, Path],
) -> None:
    arguments = argv(world, 'slime.sglang.router_policy="cache_aware"')
    start = arguments.index("--router-policy")
    assert arguments[start : start + 4] == [
        "--router-policy", "cache_aware", "--router-balance-abs-threshold", "10",
    ]  # fmt: skip
    assert "--router-assignment-mode" not in arguments  # manual's alone
    assert replay(arguments).namespace["router_balance_abs_threshold"] == 10


def test_a_policy_that_ignores_the_header_gets_neither_setting(world: dict[str, Path]) -> None:
    arguments = argv(world, 'slime.sglang.router_policy="round_robin"')
    assert "--router-assignment-mode" not in arguments
    assert "--router-balance-abs-threshold" not in arguments


def test_consistent_hashing_is_refused_as_slimes_parser_would(world: dict[str, Path]) -> None:
    with pytest.raises(ConfigError) as config_error:
        recipe(world, 'slime.sglang.router_policy="consistent_hashing"')
    assert "slime.sglang.router_policy" in config_error.value.message
    extra = 'slime.extra_args=["--router-policy", "consistent_hashing"]'
    with pytest.raises(ConfigError) as parse_error:
        check_slime(recipe(world, extra))
    assert "argument --router-policy: invalid choice: 'consistent_hashing'" in (
        parse_error.value.message
    )
