"""slime.checkpoint.keep_last: the newest complete checkpoints stay, older ones go once a newer
save has landed, and neither the one the attempt resumed from nor a save in progress is ever
touched. On 2a5d2bd every checkpoint stayed (about 460 GB each for the 32B recipe). The layout
is Megatron's (iter_NNNNNNN/ and latest_checkpointed_iteration.txt, written when a save lands)
and slime's data state beside it (rollout/global_dataset_state_dict_N.pt)."""

from __future__ import annotations

from pathlib import Path

from slurm.backends.slime.args import slime_checkpoints
from slurm.backends.slime.backend import SlimeBackend
from slurm.backends.slime.retention import Pruner, iterations, prune
from slurm.cluster_note import ClusterNode, ClusterNote, write_cluster
from slurm.run_folder import AttemptFolder, RunFolder
from tests.helpers import slime_recipe as recipe


def one_node_cluster(attempt: AttemptFolder) -> None:
    """The attempt's cluster.json as node 0's bootstrap writes it (slurm/bootstrap.py, `_join`)."""
    attempt.root.mkdir(parents=True, exist_ok=True)
    node = ClusterNode(0, "deepdive_node_0", ("http://10.0.0.1:20010",), "http://10.0.0.1:20020")
    write_cluster(attempt.cluster, ClusterNote("8-1", "x", (node,)))


def save(folder: Path, iteration: int, landed: bool = True) -> None:
    """A checkpoint as Megatron and slime write it; `landed`: the tracker names it."""
    (folder / f"iter_{iteration:07d}" / "__0_0.distcp").parent.mkdir(parents=True)
    (folder / f"iter_{iteration:07d}" / "__0_0.distcp").write_bytes(b"shard")
    (folder / "rollout").mkdir(parents=True, exist_ok=True)
    (folder / "rollout" / f"global_dataset_state_dict_{iteration}.pt").write_bytes(b"state")
    if landed:
        (folder / "latest_checkpointed_iteration.txt").write_text(f"{iteration}")


def data_states(folder: Path) -> list[str]:
    return sorted(path.name for path in (folder / "rollout").iterdir())


def test_the_newest_are_kept_and_the_resume_one_and_a_save_in_progress_stay(
    tmp_path: Path,
) -> None:
    for iteration in (20, 40, 60, 80):
        save(tmp_path, iteration)
    save(tmp_path, 100, landed=False)  # being written: the tracker still says 80
    assert prune(tmp_path, keep_last=2, resumed_from=40) == [20]
    assert iterations(tmp_path) == [40, 60, 80, 100]
    assert "global_dataset_state_dict_20.pt" not in data_states(tmp_path)
    assert prune(tmp_path, keep_last=1, resumed_from=None) == [40, 60]
    assert iterations(tmp_path) == [80, 100]  # the tracker's, and the one in progress


def test_nothing_goes_without_a_landed_save_or_with_keep_last_0(tmp_path: Path) -> None:
    save(tmp_path, 20, landed=False)
    save(tmp_path, 40, landed=False)
    assert prune(tmp_path, keep_last=1, resumed_from=None) == []  # no tracker: nothing landed
    save(tmp_path, 60)
    assert prune(tmp_path, keep_last=0, resumed_from=None) == []  # keep every one
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("release")
    assert prune(tmp_path, keep_last=1, resumed_from=None) == []
    assert iterations(tmp_path) == [20, 40, 60]


def test_a_removal_cut_short_is_finished_by_the_next(tmp_path: Path) -> None:
    for iteration in (20, 40):
        save(tmp_path, iteration)
    (tmp_path / "iter_0000020").rename(tmp_path / ".removing-iter_0000020")  # the job died
    assert iterations(tmp_path) == [40]  # no longer named as a checkpoint
    prune(tmp_path, keep_last=1, resumed_from=None)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "iter_0000040",
        "latest_checkpointed_iteration.txt",
        "rollout",
    ]


def test_node_0_prunes_after_each_new_save_never_the_checkpoint_it_resumed_from(
    world: dict[str, Path],
) -> None:
    """The backend's pruner, as node 0's bootstrap runs it every few seconds of training
    (`while_training`): nothing before this attempt's first save lands; after it, the oldest
    go, but the checkpoint train.py loaded (--load) stays for the whole attempt."""
    backend = SlimeBackend(recipe(world, "slime.checkpoint.keep_last=1"))
    folder = slime_checkpoints(backend.config)
    for iteration in (20, 40):
        save(folder, iteration)  # the previous attempt's: it resumes from 40
    attempt = RunFolder(world["root"] / "run").attempt("8-1")
    one_node_cluster(attempt)
    backend.before_training(attempt)
    pruner = backend.pruner
    assert isinstance(pruner, Pruner) and pruner.resumed_from == 40
    backend.while_training()
    pruner.wait(30)
    assert iterations(folder) == [20, 40]  # no new save yet: nothing is removed
    save(folder, 60, landed=False)
    backend.while_training()
    pruner.wait(30)
    assert iterations(folder) == [20, 40, 60]  # 60 is still being written
    (folder / "latest_checkpointed_iteration.txt").write_text("60")
    backend.while_training()
    pruner.wait(30)
    assert iterations(folder) == [40, 60] and pruner.removed == [20]
    save(folder, 80)
    backend.while_training()
    pruner.wait(30)
    assert iterations(folder) == [40, 80]  # 40 stays: this attempt resumed from it
