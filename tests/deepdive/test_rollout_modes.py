"""The rollouts the hook cannot run under are refused when slime builds its data source, in
RolloutManager.__init__ (slime/ray/rollout.py, lines 383-384, at 624b824), where an error fails
the actor and train.py with it; not only per sample, where slime's fully-async worker logs the
error and the run waits until its time limit (slime/rollout/fully_async_rollout.py, lines
141-145, 172-173 and 186-191).

slime is not installable here. Where the check must import slime's modules, a subprocess puts
stand-ins on its path under slime's module names (empty, or a data source that keeps `args`):
what is tested is our check, not slime."""

from __future__ import annotations

import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from deepdive.rollout_modes import DATA_SOURCE_PATH, checked_data_source, fully_async
from services.base.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SLIME_FULLY_ASYNC = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
DEFAULT_ROLLOUT = "slime.rollout.sglang_rollout.generate_rollout"  # arguments.py, line 331


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (
            Namespace(partial_rollout=True, rollout_function_path=DEFAULT_ROLLOUT),
            "--partial-rollout",
        ),
        (
            Namespace(partial_rollout=False, rollout_function_path=SLIME_FULLY_ASYNC),
            f"--rollout-function-path {SLIME_FULLY_ASYNC}",
        ),
        (
            Namespace(partial_rollout=False, rollout_function_path="examples.fully_async.run.go"),
            "--rollout-function-path examples.fully_async.run.go",
        ),
    ],
)
def test_the_data_source_refuses_a_rollout_that_continues_aborted_episodes(
    args: Namespace, named: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        checked_data_source(args)  # before it imports anything of slime's
    assert refused.value.message.startswith(named)
    assert "cannot continue an aborted multi-turn episode" in refused.value.message


def test_fully_async_is_the_name_rule_the_launcher_and_the_hook_share() -> None:
    assert fully_async(SLIME_FULLY_ASYNC)
    assert not fully_async(DEFAULT_ROLLOUT)
    assert f"{checked_data_source.__module__}.{checked_data_source.__name__}" == DATA_SOURCE_PATH


STAND_INS = {
    "slime/__init__.py": "",
    "slime/rollout/__init__.py": "",
    "slime/rollout/fully_async_rollout.py": "def generate_rollout_fully_async(*a, **k): ...\n",
    "slime/rollout/sglang_rollout.py": "def generate_rollout(*a, **k): ...\n",
    "slime/rollout/data_source.py": (
        "class RolloutDataSourceWithBuffer:\n"
        "    def __init__(self, args):\n"
        "        self.args = args\n"
    ),
    # a user's rollout, named nothing like it, that runs slime's fully-async one
    "team_rollouts.py": (
        "from slime.rollout.fully_async_rollout import generate_rollout_fully_async\n"
        "def generate(args, rollout_id, data_source, evaluation=False):\n"
        "    return generate_rollout_fully_async(args, rollout_id, data_source, evaluation)\n"
    ),
}


def build_data_source(
    tmp_path: Path, rollout_function_path: str
) -> subprocess.CompletedProcess[str]:
    """slime's RolloutManager.__init__, as far as the data source: `load_function` of
    --data-source-path, called with `args` (slime/ray/rollout.py, lines 383-384)."""
    for name, text in STAND_INS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    script = (
        "import importlib, sys\n"
        "from argparse import Namespace\n"
        f"module, _, name = {DATA_SOURCE_PATH!r}.rpartition('.')\n"
        "factory = getattr(importlib.import_module(module), name)\n"
        f"args = Namespace(partial_rollout=False, rollout_function_path={rollout_function_path!r})\n"
        "source = factory(args)\n"
        "print(type(source).__module__, type(source).__name__, source.args is args)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
        check=False,
    )


def test_a_rollout_that_runs_slimes_fully_async_one_under_another_name_is_refused(
    tmp_path: Path,
) -> None:
    result = build_data_source(tmp_path, "team_rollouts.generate")
    assert result.returncode != 0
    assert "ConfigError: --rollout-function-path team_rollouts.generate: it runs slime's " in (
        result.stderr
    )


def test_with_slimes_default_rollout_the_data_source_is_slimes_own(tmp_path: Path) -> None:
    result = build_data_source(tmp_path, DEFAULT_ROLLOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "slime.rollout.data_source",
        "RolloutDataSourceWithBuffer",
        "True",
    ]
