"""What every node of a job runs: one bootstrap, the node's rank deciding its part.

    every node   storage   write a probe into the attempt folder; node 0 reads them all and
                           answers, so each node knows the others see the same run folder
                 ports     the node's block of the port plan, checked free
                 launch    everything starts, nothing waits for anything to be up: Ray (node
                           0 the head, its address published first; the others join it as
                           soon as they read it), the backend's data (node 0 writes it; the
                           others wait for it), the backend's services (tool server, reward
                           server), and on node 0 a trainer that starts early
                 services  until the services answer /ready (they start faster than Ray);
                           a tool server on the internet then makes one real search and one
                           real read (slurm/node/egress.py), or the node fails naming the upstream
                 ray       until the node's Ray is up (the head, or joined to it)
    node 0       join      every node ready (Ray up, services answering) before the deadline
                 training  the backend's trainer as a child process; its exit code is the job's
    node K > 0   serving   until node 0 says the job has ended

Every phase is timestamped in the node's phase log. A node that fails leaves a note naming
itself, the phase and why, and exits non-zero; every node watches for such notes (and for its
own children dying) between polls (slurm/node/watch.py), so one failure ends the whole job in
seconds, and srun's --kill-on-bad-exit ends whatever is left. Children die with their node
(PR_SET_PDEATHSIG) and are stopped by PID, never by name (slurm/node/children.py).

Preemption and timeouts follow submitit's protocol: Slurm sends its warning (SIGURG,
`--signal`: slurm/requeue.py), submitit calls `NodeJob.checkpoint` on node 0, which first lets
the trainer save at its next rollout boundary when the warning leaves time (slurm/node/preemption.py),
then tells every node to stop and asks for a requeue (up to slurm.max_requeues), made by the batch script once
every node has stopped; the next attempt starts over in a new attempt folder, and the backend
resumes from the newest complete checkpoint in the run folder.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import submitit

from deepdive.save_timing import SAVE_TIMING_ENV
from services.base.logs import configure_logging, log_event
from services.base.process import ServiceProcess, child_preexec
from services.base.secrets import TOKEN_ENV, load_secrets
from services.base.waiting import wait_for
from slurm import requeue
from slurm.backends import Backend, ServiceSpec, build_backend
from slurm.cluster_note import ClusterNote, node_from_ready, write_cluster
from slurm.config import NODE_ADDRESS, ExperimentConfig
from slurm.node.children import NodeChildren
from slurm.node.egress import ProbeResult, Upstreams, probe_egress
from slurm.node.environment import NodeInfo, current_node
from slurm.node.network import ROUTE, node_address
from slurm.node.phases import NodeFailed, PhaseLog, Stopping
from slurm.node.ports import NodePorts, plan_node_ports, worker_ports_needed
from slurm.node.preemption import WarnedSave
from slurm.node.process_start import process_started_at
from slurm.node.ray_cluster import RAY_ENVIRONMENT, RayNode
from slurm.node.watch import FOREVER, NodeWatch
from slurm.run_folder import write_json

logger = logging.getLogger("deepdive.job")
# A failure drill, to see what a job says when a node cannot start its services:
# DEEPDIVE_DRILL=services@1 (in the environment `deepdive submit` runs in) starts node 1's
# services with an argument they refuse, so they exit at start-up as a broken one would.
DRILL_ENV = "DEEPDIVE_DRILL"
DRILL_ARGUMENT = "--refused-by-a-failure-drill"


class NodeJob(submitit.helpers.Checkpointable):
    """The callable submitit pickles and runs on every node. It holds the resolved experiment
    and nothing else (no secret: those are read on the node)."""

    def __init__(self, config: ExperimentConfig) -> None:
        self.config = config
        self._bootstrap: NodeBootstrap | None = None  # while it runs, for checkpoint()

    def __getstate__(self) -> dict[str, Any]:
        """What checkpoint() resubmits: the experiment, never the running node."""
        return {"config": self.config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.config = state["config"]
        self._bootstrap = None

    def __call__(self) -> int:
        requeue.answer_usr2_too()
        bootstrap = NodeBootstrap(self.config, current_node())
        self._bootstrap = bootstrap
        try:
            code = bootstrap.run()
        except SystemExit:  # submitit's handler ends node 0 after asking for the requeue
            bootstrap.watch.wait_for_peers_to_stop()
            raise
        if code:
            sys.exit(code)  # the trainer's exit code is the job's
        return code

    def checkpoint(  # type: ignore[override]  # submitit reads None as "do not requeue"
        self, *args: Any, **kwargs: Any
    ) -> submitit.helpers.DelayedSubmission | None:
        """submitit calls this on node 0 when the warning arrives (preemption or time limit): let
        the trainer save at its next rollout boundary if the warning leaves time for it
        (slurm/node/preemption.py), then tell every node to stop, and requeue unless the run has used
        its requeues. The end note says what the warning saved and what the requeue loses."""
        node = current_node()
        attempt = self.config.run_folder.attempt(node.attempt)
        warning = self._bootstrap.save_on_warning() if self._bootstrap is not None else {}
        allowed = self.config.slurm.max_requeues
        if node.restart_count >= allowed:
            note = {"stopped": "signal", "requeue": False, "warning": warning, "t": time.time()}
            write_json(attempt.end, note)
            logger.warning("not requeued: the run has been requeued %d times already", allowed)
            return None
        note = {"stopped": "signal", "requeue": True, "warning": warning, "t": time.time()}
        write_json(attempt.end, note)
        log_event(logger, "requeue", attempt=node.attempt, next=node.restart_count + 1)
        return super().checkpoint()


class NodeBootstrap:
    def __init__(
        self,
        config: ExperimentConfig,
        node: NodeInfo,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.node = node
        self.run_folder = config.run_folder
        self.attempt = self.run_folder.attempt(node.attempt)
        self.backend: Backend = build_backend(config)
        self.phases = PhaseLog(self.attempt.phases(node.node), node.node, node.attempt)
        self.children = NodeChildren()  # what the phases start, for the watch and the teardown
        self.service_specs: dict[str, ServiceSpec] = {}
        self.clock = clock
        self.watch = NodeWatch(
            node,
            self.attempt,
            self.phases,
            self.children,
            join_timeout_s=config.bootstrap.join_timeout_s,
            stop_timeout_s=config.bootstrap.stop_timeout_s,
            clock=clock,
        )

    @functools.cached_property
    def address(self) -> str:
        """The address the node's Ray, its services and the URLs it publishes use
        (bootstrap.node_address: the default route's, or the configured loopback one)."""
        return node_address(self.config.bootstrap.node_address)

    # -- the whole node ------------------------------------------------------------------

    def run(self) -> int:
        with node_console(self.attempt.node_log(self.node.node)):
            configure_logging("INFO")
            signal.signal(signal.SIGTERM, self.watch.on_sigterm)
            node = self.node
            self.phases.record(
                "job",
                "start",
                host=node.hostname,
                slurm_node=node.node_name,
                job=node.job_id,
                process_started=round(process_started_at(), 3),  # before Python's imports
                **self._cpus(),
            )
            if self.run_folder.finished.exists():
                self.phases.record("job", "finished_already")
                return 0
            stopped = False
            with ExitStack() as stack:
                stack.callback(self._stop_children)
                try:
                    code = self._run_phases()
                except Stopping as stop:
                    self.phases.record("job", "stopped", reason=str(stop))
                    stopped = True
                except NodeFailed as failure:
                    return self._failed(failure)
                except Exception as error:  # a bug between phases: still a note for the others
                    logger.exception("unexpected error")
                    reason = f"{type(error).__name__}: {error}"
                    return self._failed(NodeFailed(node.node, self.phases.current, reason))
            if stopped:
                if node.is_head and self.watch.terminating:
                    self.watch.name_silent_peers()
                return 0
            self.phases.record("job", "end", exit_code=code)
            return code

    def _cpus(self) -> dict[str, Any]:
        """Ray and the tool workers are sized to the CPUs the task may run on (its affinity,
        at most what Slurm gave it: slurm.node.environment.CpuGrant); where Slurm's count and the
        affinity differ, the start record says why."""
        grant = self.node.cpu_grant
        if grant is None:
            return {"cpus": self.node.cpus}
        detail: dict[str, Any] = {
            "cpus": self.node.cpus,
            "cpus_slurm": grant.slurm,
            "cpus_affinity": grant.affinity,
        }
        if grant.differs:
            detail["cpus_differ"] = grant.describe()
            logger.warning("cpus: %s", grant.describe())
        return detail

    def _run_phases(self) -> int:
        node = self.node
        with self.phases.phase("secrets"):
            environment = {**self.backend.environment(self.address), **self._secrets()}
        with self.phases.phase("storage"):
            self._check_storage()
        with self.phases.phase("ports"):
            ports, notes = self._plan_ports()
            for note in notes:
                log_event(logger, "ports", note=note)
        with self.phases.phase("launch"):
            self._launch(ports, environment)
        # the services first: they are up before Ray, and what checking them costs (an HTTP
        # client's import, a request each) is then spent while Ray still starts
        with self.phases.phase("services"):
            urls = self._services_ready()
        with self.phases.phase("ray"):
            ray = self.children.ray
            assert ray is not None
            ray.wait_started(self.config.bootstrap.join_timeout_s, check=self.watch.check)
        write_json(
            self.attempt.ready(node.node),
            {
                "node": node.node,
                "host": node.hostname,
                "slurm_node": node.node_name,
                "ray": ray.address,
                "services": urls,
                "ports": {
                    **{
                        name: port
                        for name, port in ports.all_ports()
                        if name not in ("ray_worker", "tools_worker")  # ranges: see "services"
                    },
                    "ray_max_worker": ports.ray_max_worker,  # Ray's worker range ends there
                },
            },
        )
        if not node.is_head:
            with self.phases.phase("serving"):
                self.watch.slow_down()
                end = self.watch.wait_for_note(self.attempt.end, "the end of the job", FOREVER)
            if end.get("stopped"):
                raise Stopping("node 0 stopped the job")
            return 0
        # A trainer that starts early is running already (see _launch); the others start once
        # every node is ready and the backend has written their input.
        with self.phases.phase("training"):
            with self.phases.phase("join"):
                self._join()
            if self.children.trainer is None:
                self.backend.before_training(self.attempt)  # reads cluster.json
                self._start_trainer(environment)
            self.watch.slow_down()
            code = self.watch.wait_for_trainer(self.backend.while_training)
        write_json(self.attempt.end, {"exit_code": code, "t": time.time()})
        if code == 0:
            write_json(self.run_folder.finished, {"attempt": node.attempt, "t": time.time()})
        return code

    def _launch(self, ports: NodePorts, environment: dict[str, str]) -> None:
        """Start the node's Ray and services, the slowest first; nothing waits for anything
        to be up. Node 0 publishes its head's address (its planned GCS port) before its Ray
        starts, so the others start theirs at once and Ray's own retry joins them when the
        head answers: a node's Ray start (seconds of imports and processes) overlaps the
        head's instead of following it. Node 0 writes the data while its Ray comes up; the
        others start their services once it is there. A trainer that starts early (the
        backend says) starts last: it loads its libraries, the data and the policy while Ray
        comes up and the nodes join, waits for node 0's ready note before it connects to
        Ray, and reads cluster.json, written once every node is ready."""
        if self.node.is_head:
            self._launch_ray(ports, environment, head=None)
            summary = self.backend.prepare()
            write_json(self.attempt.data, {"t": time.time(), "summary": _brief(summary)})
        else:
            head = self.watch.wait_for_note(self.attempt.head, "the Ray head's address")
            self._check_on_the_heads_host(str(head.get("host", "")))
            self._launch_ray(ports, environment, head=str(head["address"]))
            self.watch.wait_for_note(self.attempt.data, "node 0's data")
        self._launch_services(ports, environment)
        if self.node.is_head and self.backend.starts_early:
            self._start_trainer(environment)

    def _check_on_the_heads_host(self, head_host: str) -> None:
        """A loopback node address (bootstrap.node_address) is reached from its own host
        only: a node on another host than the head fails now, naming the setting, instead of
        waiting join_timeout_s for a head it cannot reach."""
        setting = self.config.bootstrap.node_address
        if setting == ROUTE or head_host == self.node.hostname:
            return
        raise NodeFailed(
            self.node.node,
            "launch",
            f"bootstrap.node_address is {setting}, a loopback address, but node 0 runs on "
            f"{head_host or 'another host'} and this node on {self.node.hostname}: no node "
            f'reaches another\'s loopback; set bootstrap.node_address = "{ROUTE}"',
        )

    def _failed(self, failure: NodeFailed) -> int:
        """Leave the note the other nodes (and `deepdive status`) read, and say it plainly."""
        if failure.node == self.node.node:
            note = {"node": failure.node, "phase": failure.phase, "error": failure.reason}
            write_json(self.attempt.failed(self.node.node), {**note, "t": time.time()})
        logger.error("job failed: %s", failure.message)
        print(f"deepdive: {failure.message}", file=sys.stderr, flush=True)
        return 1

    # -- phases ------------------------------------------------------------------------------

    def _check_storage(self) -> None:
        nonce = secrets.token_hex(8)
        write_json(self.attempt.storage_probe(self.node.node), {"nonce": nonce})
        seen = self.attempt.root / "storage" / "seen.json"
        if self.node.is_head:
            nonces = {}
            for other in range(self.node.num_nodes):
                note = self.watch.wait_for_note(
                    self.attempt.storage_probe(other), f"node {other}'s storage probe"
                )
                nonces[str(other)] = note["nonce"]
            write_json(seen, nonces)
            return
        answer = self.watch.wait_for_note(seen, "node 0's answer to the storage probes")
        if answer.get(str(self.node.node)) != nonce:
            raise NodeFailed(
                self.node.node,
                "storage",
                f"node 0 read another probe than this node wrote in {self.attempt.root}: the "
                "run folder is not the same shared storage on both nodes",
            )

    def _plan_ports(self) -> tuple[NodePorts, list[str]]:
        """The node's ports, with a Ray worker port for everything the node will run."""
        node = self.node
        workers = worker_ports_needed(node.cpus, self.config.slurm.gpus_per_node)
        return plan_node_ports(node.job_id, node.node, node.num_nodes, workers)

    def _launch_ray(self, ports: NodePorts, environment: dict[str, str], head: str | None) -> None:
        logs = self.attempt.node_logs(self.node.node)
        ray = self.children.ray = RayNode(
            node=self.node.node,
            node_ip=self.address,
            ports=ports,
            head_address=head,
            temp_dir=Path("/tmp") / f"dd-{self.node.job_id}-{self.node.node}",  # noqa: S108
            log_path=logs / "ray.log",
            logs_to=logs / "ray",
            num_cpus=self.node.cpus,
            num_gpus=self.config.slurm.gpus_per_node,
            environment=environment,
            head_wait_s=self.config.bootstrap.join_timeout_s,
        )
        if head is None:  # where the others join, before it is up
            write_json(self.attempt.head, {"address": ray.address, "host": self.node.hostname})
        ray.launch()

    def _launch_services(self, ports: NodePorts, environment: dict[str, str]) -> None:
        host = (
            self.address if self.config.services.host == NODE_ADDRESS else self.config.services.host
        )
        logs = self.attempt.node_logs(self.node.node)
        drill = [DRILL_ARGUMENT] if drilled("services", self.node.node) else []
        # services.proxy reaches the services alone: Ray and the trainer keep the job's own
        proxy = self.config.services.proxy_environment({**os.environ, **environment})
        environment = {**environment, **proxy}
        for spec in self.backend.services():
            # a tool server of N workers listens on N ports from its range of the block
            first = ports.service_ports(spec.name, spec.worker_count(self.node.cpus))[0]
            config = spec.write_config(logs)  # attempts/N/node-K/NAME.toml
            service = ServiceProcess(
                spec.name,
                [*spec.command_arguments(self.node.cpus, config), "--host", host, *drill],
                logs / f"{spec.name}.log",
                ready_timeout_s=self.config.services.ready_timeout_s,
                environment=environment,
                port=first,
            )
            self.children.services.append(service)
            self.service_specs[spec.name] = spec
            service.launch()

    def _services_ready(self) -> dict[str, list[str]]:
        """Every service answering /ready, then a tool server on the internet probed (one real
        search and one real read: slurm/node/egress.py): the services' URLs other nodes use."""
        urls = {  # each service's workers' URLs
            service.name: [
                reachable(url, self.address) for url in service.wait_ready(self.watch.check)
            ]
            for service in self.children.services
        }
        for service in self.children.services:
            spec = self.service_specs[service.name]
            if spec.service == "tools":
                self._probe_egress(service, Upstreams.of(spec.config))
        return urls

    def _probe_egress(self, service: ServiceProcess, upstreams: Upstreams) -> None:
        """The probe in a thread, this node watching its children and the other nodes' notes
        while it waits (a search may take seconds; a dead upstream, its retries)."""
        if upstreams.offline:
            reason = "the offline world answers from its own corpus: nothing leaves the cluster"
            self.phases.record("egress_probe", "skipped", service=service.name, reason=reason)
            return
        if not self.config.services.egress_probe:
            reason = "services.egress_probe = false"
            self.phases.record("egress_probe", "off", service=service.name, reason=reason)
            return
        environment = {**os.environ, **(service.environment or {})}
        outcome: list[ProbeResult | BaseException] = []

        def probe() -> None:
            try:
                outcome.append(
                    probe_egress(
                        service.urls[0],
                        upstreams,
                        session=f"egress-probe-{self.node.attempt}-node-{self.node.node}",
                        timeout_s=self.config.services.ready_timeout_s,
                        token=environment.get(TOKEN_ENV),
                        environment=environment,
                    )
                )
            except BaseException as error:  # raised below, in the phase
                outcome.append(error)

        thread = threading.Thread(target=probe, name="egress-probe", daemon=True)
        thread.start()
        wait_for(
            lambda: bool(outcome),
            timeout_s=FOREVER,
            what="the egress probe",
            check=self.watch.check,
        )
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        self.phases.record("egress_probe", "passed", service=service.name, **result.detail())

    def _join(self) -> None:
        """Every node ready (its Ray joined, its services answering): what the trainer is
        handed, in cluster.json (slurm.cluster_note)."""
        nodes = []
        for other in range(self.node.num_nodes):
            note = self.watch.wait_for_note(self.attempt.ready(other), f"node {other} to be ready")
            nodes.append(node_from_ready(other, note["services"]))
        ray = self.children.ray
        assert ray is not None
        write_cluster(
            self.attempt.cluster, ClusterNote(self.node.attempt, ray.address, tuple(nodes))
        )

    def _start_trainer(self, environment: dict[str, str]) -> None:
        command = self.backend.command(self.attempt)
        self.run_folder.record_command(command)
        resume = self.backend.resume_point()
        log_event(logger, "trainer", resume=resume or "fresh", command=shlex.join(command))
        ray = self.children.ray
        assert ray is not None
        self.children.trainer = subprocess.Popen(  # noqa: S603 (the backend's command, no shell)
            command,
            env={
                **os.environ,
                **environment,
                **RAY_ENVIRONMENT,
                "RAY_ADDRESS": ray.address,
                SAVE_TIMING_ENV: str(self.run_folder.save_timing),  # slurm/node/preemption.py
            },
            cwd=self.backend.working_directory(),
            preexec_fn=child_preexec,
        )
        self.phases.record("trainer_started", "event")

    # -- Slurm's warning ----------------------------------------------------------------------

    def save_on_warning(self) -> dict[str, Any]:
        """Node 0, warned: the trainer's save at its next rollout boundary if time allows
        (slurm/node/preemption.py), and what a requeue then loses, for the end note."""
        from slurm.view import event_files
        from slurm.view.status import REWARD_TAGS, redone

        if not self.node.is_head:
            return {}
        slurm, bootstrap = self.config.slurm, self.config.bootstrap
        wait = WarnedSave(
            self.run_folder.save_timing, slurm.signal_delay_s, bootstrap.stop_timeout_s, self.clock
        )
        outcome = wait.run(self.children.trainer)
        logged = event_files.latest(self.run_folder.tensorboard, REWARD_TAGS)
        step = logged.step if logged is not None else None
        checkpoint = self.backend.checkpoint_step()
        outcome |= {"step": step, "checkpoint": checkpoint, "lost": redone(step, checkpoint)}
        self.phases.record("warning", "save", **outcome)
        log_event(logger, "warning", **outcome)
        return outcome

    # -- secrets and children ------------------------------------------------------------------

    def _secrets(self) -> dict[str, str]:
        """The env file's values (read here, on the node), registered for redaction; they reach
        the children through their environment only."""
        return load_secrets(self.config.services.env_file)

    def _stop_children(self) -> None:
        """The node's teardown, however it ends: each child's time goes to the phase log."""
        seconds = self.children.stop(self.config.bootstrap.stop_timeout_s)
        self.phases.record("job", "children_stopped", seconds=seconds)


def reachable(url: str, address: str) -> str:
    """A URL other nodes can use: a wildcard bind address replaced by this node's."""
    for wildcard in ("//0.0.0.0:", "//[::]:"):
        url = url.replace(wildcard, f"//{address}:")
    return url


def drilled(phase: str, node: int) -> bool:
    """Whether DEEPDIVE_DRILL asks `phase` to fail on `node` ("services@1,services@2")."""
    wanted = os.environ.get(DRILL_ENV, "")
    return f"{phase}@{node}" in {item.strip() for item in wanted.split(",")}


@contextmanager
def node_console(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (and so its children's) go to the node's log file of
    this attempt; submitit's own log gets one line saying where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    print(f"deepdive: this node's log is {path}", flush=True)
    saved = os.dup(1), os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if isinstance(v, int | float | str)}
