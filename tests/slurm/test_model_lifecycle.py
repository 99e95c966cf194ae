"""Model lifecycle jobs of the same CLI and config: `deepdive convert-checkpoint` (slime's
conversion tools as a one-node job: dry runs, and a conversion that dies leaves nothing
complete-looking behind) and `deepdive eval` (end to end on CPU: two checkpoints of a real
local run, the real services, a comparison table)."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import orjson
import pytest
import tomli_w

from deepdive.trajectory_format import read_episodes
from services.base.errors import ConfigError
from slurm.backends.slime.conversion import ConversionFailed, run_to_folder
from tests.helpers import DEEPDIVE, TINY_JOB

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "deepdive-qwen.toml"
QWEN25_32B = {
    "hidden_size": 5120, "intermediate_size": 27648, "num_attention_heads": 40,
    "num_hidden_layers": 64, "num_key_value_heads": 8, "rope_theta": 1000000.0,
    "vocab_size": 152064, "max_position_embeddings": 32768, "tie_word_embeddings": False,
}  # fmt: skip


def deepdive(
    *args: str, cwd: Path | None = None, timeout: int = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEEPDIVE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def slime_world(root: Path) -> list[str]:
    model = root / "Qwen2.5-32B-Instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(QWEN25_32B))
    image = root / "train.sif"
    image.write_bytes(b"sif")
    keys = root / "keys.env"
    keys.write_text("SERPER_API_KEY=x\n")
    keys.chmod(0o600)
    values = [
        f'run.folder="{root / "run"}"',
        f'slime.model.hf_checkpoint="{model}"',
        f'slime.model.ref_load="{root / "Qwen2.5-32B-Instruct_torch_dist"}"',
        f'container.image="{image}"',
        f'services.env_file="{keys}"',
    ]
    return [item for value in values for item in ("--set", value)]


def test_to_megatron_is_a_one_node_job_writing_the_reference_checkpoint(tmp_path: Path) -> None:
    result = deepdive(
        "convert-checkpoint", "to-megatron", str(RECIPE), "--dry-run", *slime_world(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "#SBATCH --nodes=1" in out and "#SBATCH --gpus-per-node=8" in out
    assert "apptainer exec --nv" in out  # inside the training image
    command = out.strip().splitlines()[-1].split()
    # slime's documented launch for large models: torchrun, one process per GPU of the node
    # (docs/en/get_started/quick_start.md; the tool makes them pipeline stages)
    assert command[:7] == [
        "python3", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8",
        "/opt/slime/tools/convert_hf_to_torch_dist.py",
    ]  # fmt: skip
    assert command[command.index("--num-layers") + 1] == "64"  # the preset's architecture
    assert command[command.index("--hf-checkpoint") + 1] == str(tmp_path / "Qwen2.5-32B-Instruct")
    # the embedding as training pads it: 152064 is a multiple of 128 x TP 4
    assert command[command.index("--padded-vocab-size") + 1] == "152064"
    assert command[-2:] == ["--save", str(tmp_path / "Qwen2.5-32B-Instruct_torch_dist")]


def test_to_megatron_pads_the_vocabulary_as_training_at_tp_8_will(tmp_path: Path) -> None:
    """Megatron pads to a multiple of 128 x TP (megatron/training/tokenizer/tokenizer.py:110):
    152064 -> 152576 at TP 8; a checkpoint converted unpadded would not load."""
    result = deepdive(
        "convert-checkpoint", "to-megatron", str(RECIPE), "--dry-run", *slime_world(tmp_path),
        "--set", "slime.parallelism.tensor=8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1].split()
    assert command[command.index("--padded-vocab-size") + 1] == "152576"


def test_to_hf_converts_the_newest_complete_iteration_or_says_what_is_missing(
    tmp_path: Path,
) -> None:
    arguments = slime_world(tmp_path)
    missing = deepdive("convert-checkpoint", "to-hf", str(RECIPE), "--dry-run", *arguments)
    assert missing.returncode == 2 and "no complete checkpoint" in missing.stderr
    checkpoints = tmp_path / "run" / "slime_checkpoints"
    (checkpoints / "iter_0000040").mkdir(parents=True)
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("40")
    result = deepdive("convert-checkpoint", "to-hf", str(RECIPE), "--dry-run", *arguments)
    assert result.returncode == 0, result.stderr
    command = result.stdout.strip().splitlines()[-1].split()
    assert command[1] == "/opt/slime/tools/convert_torch_dist_to_hf.py"  # one process
    assert command[command.index("--input-dir") + 1] == str(checkpoints / "iter_0000040")
    # Megatron's padding cut off the embedding and output layer (the tool's remove_padding)
    assert command[command.index("--vocab-size") + 1] == "152064"
    assert command[-1] == str(tmp_path / "run" / "converted" / "iter_0000040_hf")
    wrong = deepdive(
        "convert-checkpoint", "to-hf", str(RECIPE), "--dry-run", "--iteration", "7", *arguments
    )
    assert wrong.returncode == 2 and "no checkpoint at" in wrong.stderr


def test_a_conversion_that_dies_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    output = tmp_path / "converted" / "model_torch_dist"
    dies = "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(); (p / 'half').write_text('x'); sys.exit(3)"
    with pytest.raises(ConversionFailed, match="exited with status 3; nothing was written"):
        run_to_folder(lambda folder: [sys.executable, "-c", dies, str(folder)], output)
    assert not output.exists() and list(output.parent.iterdir()) == []  # no partial left either
    works = "import pathlib, sys; p = pathlib.Path(sys.argv[1]); p.mkdir(); (p / 'weights').write_text('w')"
    run_to_folder(lambda folder: [sys.executable, "-c", works, str(folder)], output)
    assert (output / "weights").read_text() == "w"
    with pytest.raises(ConfigError, match="exists already"):
        run_to_folder(lambda folder: [sys.executable, "-c", works, str(folder)], output)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real local run of the tiny experiment (4 GRPO steps, checkpoints at 2 and 4)."""
    root = tmp_path_factory.mktemp("eval")
    local = tomllib.loads(TINY_JOB.read_text())["local"]
    local["run"]["out"] = str(root / "run")
    local["grpo"]["steps"] = 4
    (root / "local.toml").write_text(tomli_w.dumps(local))
    result = deepdive("run", str(root / "local.toml"), timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return root


@pytest.mark.slow
def test_eval_compares_two_checkpoints_of_a_real_run_end_to_end(trained: Path) -> None:
    run = trained / "run"
    out = trained / "eval"
    result = deepdive(
        "eval", str(TINY_JOB), "--set", f'run.folder="{run}"',
        "--checkpoint", str(run / "checkpoints" / "step-000002"), "--checkpoint", "latest",
        "--data", str(run / "data" / "eval.jsonl"), "--samples", "2", "--out", str(out),
        timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [orjson.loads(line) for line in (out / "results.jsonl").read_bytes().splitlines()]
    questions = len((run / "data" / "eval.jsonl").read_bytes().splitlines())
    assert len(rows) == 2 * questions * 2
    assert {row["checkpoint"] for row in rows} == {"step-000002", "latest (final_model)"}
    for row in rows:
        assert set(row) >= {
            "id",
            "question",
            "label",
            "answer",
            "reward",
            "status",
            "turns",
            "tool_calls",
            "trajectory",
        }
        assert row["reward"] in (0.0, 1.0) and row["trajectory"]
    # the records training keeps (deepdive.trajectory_format): the viewer reads both
    episodes = list(read_episodes(out / "results.jsonl"))
    assert len(episodes) == len(rows) and all(e.evaluation and e.checkpoint for e in episodes)
    assert all(e.turns and e.question for e in episodes)
    summary = json.loads((out / "summary.json").read_text())
    for name in ("step-000002", "latest (final_model)"):
        entry = summary[name]
        assert entry["questions"] == questions and entry["episodes"] == 2 * questions
        assert 0.0 <= entry["accuracy"] <= entry["pass_at_2"] <= 1.0
        assert sum(entry["statuses"].values()) == 2 * questions
    assert "step-000002" in result.stdout and "latest (final_model)" in result.stdout  # the table
    assert "pass@2" in result.stdout
    # the viewer reads what this eval wrote: the episodes of one checkpoint, turn by turn
    assert f"deepdive trajectories {out}" in result.stdout
    viewer = deepdive("trajectories", str(out), "--where", "checkpoint=step-000002", "--limit", "1")
    assert viewer.returncode == 0, viewer.stderr[-2000:]
    assert "turn 1" in viewer.stdout and f"1 of {2 * questions} matching" in viewer.stdout
    page = deepdive("trajectories", str(out), "--html", str(out / "episodes.html"))
    assert page.returncode == 0, page.stderr[-2000:]
    assert (out / "episodes.html").read_text().count('<details class="episode"') == len(rows)


@pytest.mark.slow
def test_the_viewer_reads_the_episodes_and_statistics_a_local_run_recorded(trained: Path) -> None:
    run = trained / "run"
    newest = deepdive("trajectories", str(run), "--last", "--limit", "2")
    assert newest.returncode == 0, newest.stderr[-2000:]
    assert "step 4" in newest.stdout and "turn 1" in newest.stdout
    page = deepdive("trajectories", str(run), "--html", str(trained / "report.html"))
    assert page.returncode == 0, page.stderr[-2000:]
    text = (trained / "report.html").read_text()
    assert "training: agent statistics over every episode" in text  # stats.jsonl
    assert "training: the recorded episodes" in text and 'data-step="4"' in text


@pytest.mark.slow
def test_eval_dry_run_names_each_checkpoint_how_it_is_served_and_the_services(
    trained: Path,
) -> None:
    run = trained / "run"
    result = deepdive(
        "eval", str(TINY_JOB), "--set", f'run.folder="{run}"', "--checkpoint", "latest",
        "--checkpoint", str(run / "checkpoints" / "step-000002"),
        "--data", str(run / "data" / "eval.jsonl"), "--dry-run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (
        f"latest (final_model): {run / 'final_model'} (hf), served by the local engine"
        in result.stdout
    )
    assert "step-000002" in result.stdout and "(step)" in result.stdout
    # each service's config file as it would be written: the run's own world
    assert "python -m services tools --config tools.toml" in result.stdout
    assert f'corpus = "{run / "world" / "corpus.jsonl"}"' in result.stdout
    assert not (run / "eval").exists()


@pytest.mark.slow
def test_eval_fails_fast_on_bad_input(trained: Path, tmp_path: Path) -> None:
    run = trained / "run"
    base = ["eval", str(TINY_JOB), "--set", f'run.folder="{run}"']
    missing = deepdive(
        *base, "--checkpoint", str(tmp_path / "nothing"), "--data", str(run / "data" / "eval.jsonl")
    )
    assert missing.returncode == 2 and "not a Hugging Face model folder" in missing.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = deepdive(*base, "--checkpoint", "latest", "--data", str(empty))
    assert result.returncode == 2 and "no rows to evaluate" in result.stderr
    assert "Traceback" not in missing.stderr + result.stderr
