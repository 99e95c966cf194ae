"""Where a site's file systems meet the job, checked before submission: every path the job reads
is visible inside the image with the configured binds; slime's run folder is not inside the
checkout; its file system holds two checkpoints. On 2a5d2bd none of these was checked: the
dry runs below passed, and the job would have failed on its nodes after its wait in the queue
(a model the image cannot see), or filled the checkout's disk."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from slurm.backends.slime.retention import checkpoint_bytes, disk_warnings, free_bytes
from slurm.config import ExperimentConfig
from slurm.launch.image_mounts import invisible, visible_roots
from slurm.launch.preflight import missing_inputs
from tests.helpers import QWEN25_32B, slime_dry_run
from tests.helpers import slime_recipe as recipe

ROOT = Path(__file__).resolve().parents[2]


def with_container(
    config: ExperimentConfig, binds: list[str] | None = None, options: list[str] | None = None
) -> ExperimentConfig:
    container = config.container
    container = dataclasses.replace(
        container,
        binds=container.binds if binds is None else binds,
        options=container.options if options is None else options,
    )
    return dataclasses.replace(config, container=container)


def hidden_keys(config: ExperimentConfig) -> list[str]:
    return [item.split(":")[0] for item in missing_inputs(config) if "not visible" in item]


def test_a_contained_image_sees_none_of_the_worlds_files(world: dict[str, Path]) -> None:
    """The world lies under /tmp, which Apptainer mounts by default; --contain drops it."""
    config = recipe(world)
    assert hidden_keys(config) == []
    contained = with_container(config, options=["--contain"])
    assert hidden_keys(contained) == [
        "slime.model.hf_checkpoint",
        "slime.model.ref_load",
        "slime.rollout.prompt_data",
        "services.env_file",
    ]
    message = next(item for item in missing_inputs(contained) if "not visible" in item)
    assert "add it, or a folder above it, to container.binds" in message
    bound = with_container(contained, binds=[str(world["root"])])
    assert hidden_keys(bound) == []  # the world's folder bound: all of it is seen


def test_a_bind_to_another_path_does_not_show_the_file_where_the_job_reads_it(
    tmp_path: Path,
) -> None:
    config = recipe_free_container(tmp_path)
    paths = {"slime.model.hf_checkpoint": "/data/models/qwen"}
    assert invisible(paths, config.run.folder, config.container) == [
        ("slime.model.hf_checkpoint", "/data/models/qwen")
    ]
    moved = with_container(config, binds=["/data:/mnt/data"])
    assert invisible(paths, moved.run.folder, moved.container)  # seen at /mnt/data, not /data
    for binds in (["/data"], ["/data:/data:ro"], ["/scratch,/data"]):
        same = with_container(config, binds=binds)
        assert invisible(paths, same.run.folder, same.container) == [], binds


def test_the_home_counts_unless_apptainer_is_told_not_to_mount_it(tmp_path: Path) -> None:
    config = recipe_free_container(tmp_path)
    home = str(Path.home() / ".deepdive.env")
    paths = {"services.env_file": home}
    assert invisible(paths, config.run.folder, config.container) == []
    for options in (["--no-home"], ["--contain"], ["-c"], ["--no-mount=home,cwd"]):
        changed = with_container(config, options=options)
        assert invisible(paths, changed.run.folder, changed.container), options
    assert str(Path.home().resolve()) in visible_roots(config.run.folder, config.container)


def recipe_free_container(tmp_path: Path) -> ExperimentConfig:
    """An experiment with an image and no binds of its own (the run folder in tmp_path)."""
    return dataclasses.replace(
        ExperimentConfig(),
        run=dataclasses.replace(ExperimentConfig().run, folder=str(tmp_path / "run")),
        container=dataclasses.replace(ExperimentConfig().container, image=str(tmp_path / "x.sif")),
    )


def test_the_dry_run_names_a_path_the_image_cannot_see(world: dict[str, Path]) -> None:
    result = slime_dry_run(world, 'container.options=["--contain"]')
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        f"missing: slime.model.hf_checkpoint: {world['model']} is not visible inside the image"
        in (result.stderr)
    )


def test_slimes_run_folder_may_not_be_inside_the_checkout(world: dict[str, Path]) -> None:
    inside = recipe(world, f'run.folder="{ROOT / "runs" / "qwen"}"')
    refused = [item for item in missing_inputs(inside) if item.startswith("run.folder")]
    assert refused and f"is inside the launcher's checkout ({ROOT})" in refused[0]
    assert not [item for item in missing_inputs(recipe(world)) if item.startswith("run.folder")]


def test_two_checkpoints_must_fit_the_run_folders_file_system(tmp_path: Path) -> None:
    size = checkpoint_bytes(QWEN25_32B)
    assert size == pytest.approx(14 * 32.76e9, rel=1e-3)  # about 459 GB, Adam's states included
    warnings = disk_warnings(tmp_path, 3, QWEN25_32B, free_bytes=500 * 10**9)
    assert len(warnings) == 1
    assert "500 GB free, but two checkpoints need 917 GB (459 GB each" in warnings[0]
    assert disk_warnings(tmp_path, 3, QWEN25_32B, free_bytes=10**12) == []
    assert free_bytes(tmp_path / "not" / "yet") == free_bytes(tmp_path)  # where it will be
