"""A node's watch over its job, from its first wait to its last: between polls it looks for
another node's failure note, node 0 stopping the job and its own children dying, so one
failure ends the whole job in seconds; it reads the notes the phases wait for, waits for the
trainer, and takes Slurm's SIGTERM (a cancel, a requeue, a preemption) as the end of the job,
not as a failure.

The phases (slurm/bootstrap.py) hand it what they start (slurm/node/children.py) and wait
through it. Once the job ends, node 0 names the peers that died without a word, and before it
exits for a requeue lets every other node finish stopping its children.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from services.base.errors import DeepDiveError
from services.base.waiting import wait_for
from slurm.node.cadence import LONG_POLL_S, START_POLL_S, Cadence
from slurm.node.children import NodeChildren
from slurm.node.environment import NodeInfo
from slurm.node.phases import NodeFailed, PhaseLog, Stopping, last_phase, read_phases
from slurm.run_folder import AttemptFolder, read_json, write_json

logger = logging.getLogger("deepdive.job")
FOREVER = float("inf")
# While the node starts, a child that dies is named by its own phase (services, ray).
STARTING = {"secrets", "storage", "ports", "launch", "ray", "services"}
# A node told to stop by Slurm says so in its phase log within a second or two; one that has
# not after this long (from node 0's own SIGTERM) died before Slurm ended the job.
PEER_WORD_S = 3.0
FINAL_EVENTS = {"stopped", "end", "failed", "finished_already"}


class NodeWatch:
    """One node's watch: every wait of its phases checks through it, and its SIGTERM handler
    is what tells a job ending on purpose from a child dying."""

    def __init__(
        self,
        node: NodeInfo,
        attempt: AttemptFolder,
        phases: PhaseLog,
        children: NodeChildren,
        *,
        join_timeout_s: float,
        stop_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.attempt = attempt
        self.phases = phases
        self.children = children
        self.join_timeout_s = join_timeout_s  # bootstrap.join_timeout_s: a note's default wait
        self.stop_timeout_s = stop_timeout_s  # bootstrap.stop_timeout_s: a child's stop
        self.clock = clock
        self.terminating = False
        self.terminated_at = 0.0
        # the shared file system: read at once while the job starts, every few seconds after
        self.shared = Cadence(START_POLL_S, clock)
        self.ray_logs = Cadence(LONG_POLL_S, clock)  # Ray's worker logs, on local disk
        self._shared_fresh = True

    def slow_down(self) -> None:
        """The long phases (serving, training): the shared file system every LONG_POLL_S."""
        self.shared.slow_down()

    def check(self) -> None:
        """Between polls: give up when another node failed, the job is ending, or one of this
        node's own children died (the shared file system only when its cadence says)."""
        if self.shared.due():
            self._check_shared()
            self._shared_fresh = True  # a note awaited may be read in the next round
        trainer = self.children.trainer  # it may start before the training phase (starts_early)
        early = self.phases.current != "training"  # there, wait_for_trainer reads its exit
        if trainer is not None and trainer.poll() is not None and early:
            if self.terminating:
                raise Stopping("Slurm is ending the job (SIGTERM)")
            raise NodeFailed(
                self.node.node,
                "training",
                f"the trainer exited with status {trainer.returncode} before every node was "
                f"ready (its output is in {self.attempt.node_log(self.node.node)})",
            )
        failures = [(service.failure(), "services") for service in self.children.services]
        ray = self.children.ray
        if ray is not None and not ray.alive():
            failures.append((f"ray exited; its log ends with:\n{ray.log_tail()}", "ray"))
        if ray is not None and self.ray_logs.due():
            failures.append((ray.worker_port_exhaustion(), "ray"))
        dead = [(reason, phase) for reason, phase in failures if reason is not None]
        if dead and self.terminating:
            raise Stopping("Slurm is ending the job (SIGTERM)")
        if dead:
            reason, phase = dead[0]
            if self.phases.current not in STARTING:
                phase = self.phases.current
            raise NodeFailed(self.node.node, phase, reason)

    def _check_shared(self) -> None:
        """The other nodes' news: a failure note, or node 0 stopping the job."""
        for failure in self.attempt.failures():
            if failure.get("node") != self.node.node:
                raise NodeFailed(int(failure["node"]), str(failure["phase"]), str(failure["error"]))
        end = read_json(self.attempt.end)
        if isinstance(end, dict) and end.get("stopped"):
            raise Stopping("the job is being stopped (preemption or time limit)")

    def wait_for_note(
        self, path: Path, what: str, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """Another node's note, read with the other nodes' news (at their cadence); this
        node's phase fails naming `what` if it is not there within `timeout_s`
        (bootstrap.join_timeout_s unless given)."""

        def probe() -> dict[str, Any] | None:
            if not self._shared_fresh:  # read with the other nodes' news, at their cadence
                return None
            self._shared_fresh = False
            note = read_json(path)
            return note if isinstance(note, dict) else None

        limit = self.join_timeout_s if timeout_s is None else timeout_s
        try:
            return wait_for(probe, timeout_s=limit, what=f"waiting for {what}", check=self.check)
        except DeepDiveError as error:
            if isinstance(error, NodeFailed):
                raise
            raise NodeFailed(self.node.node, self.phases.current, error.message) from None

    def wait_for_trainer(self, housekeeping: Callable[[], None]) -> int:
        """Until the trainer exits, watching as ever and calling `housekeeping` (the backend's
        while_training: slime's checkpoint retention) every LONG_POLL_S; its exit code."""
        trainer = self.children.trainer
        assert trainer is not None
        due = Cadence(LONG_POLL_S, self.clock)

        def check() -> None:
            self.check()
            if due.due():
                housekeeping()

        wait_for(
            lambda: trainer.poll() is not None,
            timeout_s=FOREVER,
            what="the trainer",
            check=check,
        )
        if self.terminating:  # it got Slurm's SIGTERM with everything else
            raise Stopping("Slurm is ending the job (SIGTERM)")
        return trainer.returncode

    def name_silent_peers(self) -> None:
        """Slurm ended the job: if a node did not say why (no stop, end or failure in its phase
        log within PEER_WORD_S of the SIGTERM), it died first and srun ended the others
        (--kill-on-bad-exit). Leave the failure note it could not, naming it and its phase, so
        `deepdive status` tells its death from a cancel long after Slurm forgets the job."""
        deadline = self.terminated_at + PEER_WORD_S
        while True:
            silent = [
                other
                for other in range(self.node.num_nodes)
                if other != self.node.node and not self._has_word(other)
            ]
            if not silent or self.clock() >= deadline:
                break
            time.sleep(0.1)
        for other in silent:
            phase = last_phase(read_phases(self.attempt.phases(other)))
            reason = (
                "it ended without a word: its bootstrap was killed (SIGKILL, the out-of-memory "
                "killer) or its host went down, and Slurm then ended the job (node "
                f"{self.node.node} found no stop, end or failure in "
                f"{self.attempt.phases(other).name})"
            )
            note = {"node": other, "phase": phase, "error": reason, "reported_by": self.node.node}
            write_json(self.attempt.failed(other), {**note, "t": time.time()})
            logger.error("job failed: node %d failed during %s: %s", other, phase, reason)
            print(f"deepdive: node {other} failed during {phase}: {reason}", file=sys.stderr)

    def wait_for_peers_to_stop(self) -> None:
        """Node 0 asked for a requeue, which the batch script makes once srun returns: before
        this process exits non-zero (submitit's way; srun's --kill-on-bad-exit then signals
        what is left of the step), let every other node finish stopping its children, so no
        node is torn down by a signal (inside an image, SIGTERM unmounts it: slurm/requeue.py)."""
        if not self.node.is_head or not self.attempt.requeue_asked.exists():
            return
        deadline = self.clock() + LONG_POLL_S + 2 * self.stop_timeout_s + 10
        others = set(range(1, self.node.num_nodes))
        while others and self.clock() < deadline:
            others = {other for other in others if not self._has_stopped(other)}
            time.sleep(0.2)
        if others:
            logger.warning("requeue: node(s) %s still stopping; srun ends them", sorted(others))

    def _has_stopped(self, other: int) -> bool:
        lines = read_phases(self.attempt.phases(other))
        return any(line.get("event") == "children_stopped" for line in lines)

    def _has_word(self, other: int) -> bool:
        if self.attempt.failed(other).exists():
            return True
        lines = read_phases(self.attempt.phases(other))
        return any(line.get("event") in FINAL_EVENTS for line in lines)

    def on_sigterm(self, number: int, frame: FrameType | None) -> None:
        """Slurm is ending the job (cancel, requeue, preemption). Like submitit, keep running
        (the warning may follow, to checkpoint and requeue), but read children dying as
        expected."""
        if not self.terminating:
            self.terminated_at = self.clock()
        self.terminating = True
        logger.warning("SIGTERM: Slurm is ending the job; children ending now is expected")
