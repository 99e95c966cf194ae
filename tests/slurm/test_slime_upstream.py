"""The recipe's argv against slime's own run scripts at 624b824, as docs/slime.md tabulates it:
what every script passes, we pass or the table says why not, and the table says what the argv
does. slime is not in CI: the flags its 23 scripts/run-*.sh all pass are written here, read from
them at the pin."""

from __future__ import annotations

import re
from pathlib import Path

from slurm.backends.slime.args import slime_arguments
from tests.helpers import slime_recipe

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "slime.md"
# train.py flags in all 23 scripts/run-*.sh at 624b824 (commented lines excluded)
EVERY_SCRIPT = {
    "--hf-checkpoint", "--ref-load", "--prompt-data", "--input-key", "--rollout-shuffle",
    "--rollout-batch-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--use-dynamic-batch-size", "--max-tokens-per-gpu", "--optimizer", "--lr",
    "--lr-decay-style", "--weight-decay", "--adam-beta1", "--adam-beta2", "--attention-dropout",
    "--hidden-dropout", "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32",
    "--actor-num-nodes", "--actor-num-gpus-per-node",
}  # fmt: skip
# MISC_ARGS of scripts/run-qwen2.5-0.5B-reproducibility.sh (lines 100-109) and
# scripts/run-qwen2.5-0.5B-gb10-smoke.sh (lines 85-91), the preset's own scripts, in order
QWEN25_MISC = [
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
    "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32",
    "--attention-backend", "flash",
]  # fmt: skip


def table() -> dict[str, str]:
    """flag -> "passed" | "not passed" | "optional", from docs/slime.md."""
    rows = re.findall(
        r"^\| `(--[a-z0-9-]+)` \| [^|]+ \| [^|]+ \| ([a-z ]+) \|", TABLE.read_text(), re.M
    )
    return dict(rows)


def test_the_recipe_passes_the_misc_args_of_slimes_qwen25_scripts(world: dict[str, Path]) -> None:
    groups = dict(slime_arguments(slime_recipe(world), Path("/x.yaml")).groups)
    assert groups["MISC_ARGS"] == QWEN25_MISC


def test_what_every_slime_script_passes_is_passed_or_explained(world: dict[str, Path]) -> None:
    rows = table()
    assert set(rows.values()) <= {"passed", "not passed", "optional"}
    assert set(rows) >= EVERY_SCRIPT, sorted(EVERY_SCRIPT - set(rows))
    flags = set(slime_arguments(slime_recipe(world), Path("/x.yaml")).flags())
    assert {flag for flag in EVERY_SCRIPT if rows[flag] != "passed"} == set()
    wrong = [
        flag
        for flag, ours in rows.items()
        if (ours == "passed") != (flag in flags) and ours != "optional"
    ]
    assert wrong == []  # the table says what the argv does
