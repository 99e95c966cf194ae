"""A node's watch without a cluster (slurm/node/watch.py): how often it reads the shared file
system, a trainer that exits while the node starts, the peers node 0 names after Slurm ended
the job, and node 0 letting every node stop before it exits for a requeue."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from slurm.node.cadence import LONG_POLL_S
from slurm.node.environment import NodeInfo
from slurm.node.phases import NodeFailed, PhaseLog, Stopping
from slurm.node.watch import PEER_WORD_S, NodeWatch
from slurm.run_folder import RunFolder
from slurm.view.status import run_status
from tests.helpers import FakeClock, node_watch


def watch_at(
    tmp_path: Path, node: int, clock: Callable[[], float], num_nodes: int = 2
) -> NodeWatch:
    info = NodeInfo("4711", node, num_nodes, "host", "n1", 0, 2)
    return node_watch(tmp_path / "run", info, clock)


def test_a_serving_node_reads_the_shared_file_system_every_few_seconds_not_every_poll(
    tmp_path: Path,
) -> None:
    """While the job starts, a failure note is seen at the next poll; once a node serves (or
    trains), it reads the shared folder every LONG_POLL_S and no more often (it had read it
    every 0.25 s for the whole run: ~700 metadata operations a minute per node)."""
    clock = FakeClock()
    watch = watch_at(tmp_path, 1, clock)
    watch.check()  # starting: reads at once
    failure = {"node": 0, "phase": "training", "error": "boom"}
    watch.attempt.root.mkdir(parents=True, exist_ok=True)
    (watch.attempt.failed(0)).write_bytes(orjson.dumps(failure))
    with pytest.raises(NodeFailed, match="node 0 failed during training: boom"):
        watch.check()

    clock = FakeClock()
    watch = watch_at(tmp_path, 1, clock)
    watch.slow_down()  # what the serving phase does
    watch.attempt.failed(0).unlink()
    watch.check()  # t = 0: reads, nothing there
    watch.attempt.failed(0).write_bytes(orjson.dumps(failure))
    for _ in range(19):  # polls 0.25 s apart: none of them reads the shared folder
        clock.now += 0.25
        watch.check()
    clock.now += 0.25  # LONG_POLL_S after the last read
    assert clock.now - 1000.0 == LONG_POLL_S
    with pytest.raises(NodeFailed, match="node 0 failed during training"):
        watch.check()


def test_node_0_names_a_peer_that_ended_without_a_word(tmp_path: Path) -> None:
    """Slurm ended the job (srun's --kill-on-bad-exit after node 1's bootstrap was killed):
    node 0 finds node 1's phase log open in its serving phase and leaves the failure note
    node 1 could not; a node that stopped as told is not named."""
    clock = FakeClock()
    watch = watch_at(tmp_path, 0, clock)
    for node, events in ((1, ["start"]), (0, ["start", "stopped"])):
        log = PhaseLog(watch.attempt.phases(node), node, "4711-0")
        log.record("serving" if node else "training", "start")
        if "stopped" in events:
            log.record("job", "stopped", reason="SIGTERM")
    watch.on_sigterm(15, None)
    clock.now += PEER_WORD_S  # node 1 said nothing for this long
    watch.name_silent_peers()
    note = orjson.loads(watch.attempt.failed(1).read_bytes())
    assert (note["node"], note["phase"], note["reported_by"]) == (1, "serving", 0)
    assert "killed" in note["error"]
    status = run_status(RunFolder(tmp_path / "run"))
    assert status.failures and status.failures[0]["node"] == 1

    quiet = watch_at(tmp_path / "b", 0, clock)
    log = PhaseLog(quiet.attempt.phases(1), 1, "4711-0")
    log.record("serving", "start")
    log.record("job", "stopped", reason="SIGTERM")
    log.record("job", "children_stopped", seconds={"ray": 1.1})  # its teardown, after
    quiet.on_sigterm(15, None)
    quiet.name_silent_peers()
    assert not quiet.attempt.failed(1).exists()


def test_a_trainer_that_exits_while_the_node_starts_fails_it_naming_training(
    tmp_path: Path,
) -> None:
    """A trainer that starts early starts with Ray and the services: its exit before the
    training phase (a bad import, a broken config) fails the node at once, named, in every
    phase the node is still starting (before, only while node 0 waited for the others)."""
    watch = watch_at(tmp_path, 0, FakeClock())
    watch.children.trainer = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    watch.children.trainer.wait()
    for phase in ("ray", "services", "join"):
        with pytest.raises(NodeFailed) as failure, watch.phases.phase(phase):
            watch.check()
        assert failure.value.phase == "training"
        assert "the trainer exited with status 3 before every node was ready" in str(
            failure.value.message
        )
    watch.on_sigterm(15, None)  # Slurm ending the job: the trainer went with it
    with pytest.raises(Stopping), watch.phases.phase("ray"):
        watch.check()


def test_node_0_lets_every_node_stop_before_it_exits_for_a_requeue(tmp_path: Path) -> None:
    """srun's --kill-on-bad-exit signals what is left of the step when node 0 exits (submitit
    exits -1 after a requeue): node 0 waits until every peer has stopped its children."""
    ticks = itertools.count(1000.0, 0.5)
    watch = watch_at(tmp_path, 0, lambda: next(ticks), num_nodes=3)
    attempt = watch.attempt
    attempt.root.mkdir(parents=True)
    attempt.requeue_asked.write_text("{}")
    for node in (1, 2):
        log = PhaseLog(attempt.phases(node), node, "4711-0")
        log.record("job", "stopped")
        log.record("job", "children_stopped")
    watch.wait_for_peers_to_stop()
    assert next(ticks) < 1002.0  # returned at once

    # node 2 never finishes: node 0 gives up after a bound (LONG_POLL_S, two stop timeouts
    # and a margin)
    (attempt.phases(2)).write_bytes(b"")
    ticks = itertools.count(2000.0, 5.0)
    watch.clock = lambda: next(ticks)
    watch.wait_for_peers_to_stop()
    assert 2015.0 < next(ticks) < 2040.0


def test_node_0_does_not_wait_without_a_requeue(tmp_path: Path) -> None:
    ticks = itertools.count(1000.0, 0.5)
    watch = watch_at(tmp_path, 0, lambda: next(ticks), num_nodes=3)
    watch.wait_for_peers_to_stop()  # no request: nobody is waited for
    assert next(ticks) < 1002.0
