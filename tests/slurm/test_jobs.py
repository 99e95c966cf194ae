"""`deepdive submit` on a real Slurm (Debian's slurmctld, slurmd and munge, two emulated nodes
on this host, started by scripts/local-slurm.sh): real Ray, real services, real requeues."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from slurm.run_folder import AttemptFolder
from tests.helpers import (
    DEEPDIVE,
    descendants,
    job_fields,
    job_left_queue,
    listening_sockets,
    newest_checkpoint,
    on_loopback,
    processes_of_job,
    submitted_job_id,
    tiny_job,
    wait_until,
)

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")

# A Ray actor placed on node 1 (its custom resource) that prints and raises in its constructor:
# run as a driver of the job's Ray cluster from outside, as slime's train.py runs on node 0.
FAILING_ACTOR = """
import sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], logging_level="ERROR")
# node 1's Ray node (its deepdive_node_1 unit is the rollout worker's): placed there by id
(node_1,) = [n["NodeID"] for n in ray.nodes() if "deepdive_node_1" in n["Resources"]]

@ray.remote(num_cpus=0)
class Doomed:
    def __init__(self):
        print("actor-on-node-1 says hello", flush=True)
        raise ValueError("actor-on-node-1 breaks")

    def ping(self):
        return 1

doomed = Doomed.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_1, soft=False))
try:
    ray.get(doomed.remote().ping.remote(), timeout=120)
except Exception as error:
    print("driver saw", type(error).__name__, flush=True)
"""
CANARY_KEY = "serper-canary-7f3e9a41c2b8d605"
CANARY_TOKEN = "service-token-canary-51c0ffee9e2d"
JOB_TIMEOUT_S = 300
# What Ray 2.60 listens on at every address whatever --node-ip-address says: its C++ gRPC
# servers (src/ray/rpc/grpc_server.cc binds "0.0.0.0:" + port unless a server asks for
# localhost, which the GCS, the raylet and the core workers never do) and the autoscaler
# monitor's metrics (autoscaler/_private/monitor.py: localhost only for a head at 127.0.0.1,
# the address `ray start` replaces with the host's). No setting moves them; anything else the
# job listens on must be on loopback (bootstrap.node_address, services.host).
RAY_WILDCARD_PORTS = ("ray_gcs", "ray_node_manager", "ray_object_manager")
AUTOSCALER_METRICS_PORT = 44217  # ray.autoscaler._private.constants.AUTOSCALER_METRIC_PORT
WILDCARDS = ("0.0.0.0", "::")


def deepdive(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DEEPDIVE, *args], env=env, capture_output=True, text=True, timeout=60)


def submit(arguments: list[str], env: dict[str, str]) -> str:
    result = deepdive("submit", *arguments, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return submitted_job_id(result.stdout)


def metrics(run: Path) -> list[dict[str, Any]]:
    return [
        orjson.loads(line) for line in (run / "logs" / "metrics.jsonl").read_bytes().splitlines()
    ]


def attempts(run: Path) -> list[Path]:
    return sorted(path for path in (run / "attempts").iterdir() if path.is_dir())


def note(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def ray_temp_dirs(job_id: str) -> list[Path]:
    return list(Path("/tmp").glob(f"dd-{job_id}-*"))  # where the bootstrap puts them


def phase_times(attempt: Path, node: int) -> dict[tuple[str, str], float]:
    lines = [
        orjson.loads(line)
        for line in (attempt / f"node-{node}.phases.jsonl").read_bytes().splitlines()
    ]
    return {(line["phase"], line["event"]): line["t"] for line in lines}


def weights(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def ray_wildcard_ports(attempt: Path, nodes: int) -> set[int]:
    """The ports of the nodes' plans that Ray itself binds on every address (above)."""
    found = {AUTOSCALER_METRICS_PORT}
    for node in range(nodes):
        ports = note(attempt / f"node-{node}.json")["ports"]
        found |= {ports[name] for name in RAY_WILDCARD_PORTS}
        found |= set(range(ports["ray_min_worker"], ports["ray_max_worker"] + 1))
    return found


def listeners_of_job(job_id: str) -> list[tuple[str, str, int]]:
    """(process, address, port) of every TCP socket the job listens on: its processes (srun's
    too) and each node's bootstrap's descendants (Ray's among them: a process that sets its
    title, as Ray's agents do, no longer shows its environment)."""
    members: set[int] = set()
    for line in processes_of_job(job_id):
        pid, command = line.split(": ", 1)
        members.add(int(pid))
        if "submitit.core._submit" in command and not command.startswith("srun "):
            members.update(descendants(int(pid)))
    found = []
    for member in sorted(members):
        try:
            title = Path(f"/proc/{member}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # it ended meanwhile
            continue
        for host, port in listening_sockets(member):
            found.append((title.decode(errors="replace")[:80], host, port))
    return found


def every_file(root: Path) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file()]


class CommandLines:
    """Every process's command line, sampled while a job runs (what `ps` shows)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            result = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
            self.seen.update(result.stdout.splitlines())
            self._stop.wait(0.3)


def test_a_two_node_job_trains_with_rollouts_from_both_nodes_and_keeps_secrets(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    env_file = tmp_path / "keys.env"
    env_file.write_text(f"SERPER_API_KEY={CANARY_KEY}\nDEEPDIVE_SERVICE_TOKEN={CANARY_TOKEN}\n")
    env_file.chmod(0o600)
    run = tmp_path / "run"
    job = tiny_job(run, 4, f'services.env_file="{env_file}"')
    with CommandLines() as commands:
        submitted = deepdive("submit", *job, env=job_env)
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted_job_id(submitted.stdout)
        wait_until(lambda: job_left_queue(job_id, job_env), JOB_TIMEOUT_S, "the job to end")

    fields = job_fields(job_id, job_env)
    assert fields["JobState"] == "COMPLETED", fields
    assert fields["ExitCode"] == "0:0"
    assert (run / "finished.json").is_file()
    (attempt,) = attempts(run)
    cluster = note(attempt / "cluster.json")
    assert [node["node"] for node in cluster["nodes"]] == [0, 1]
    assert "rollout workers: one on each of nodes 0, 1" in (attempt / "node-0.log").read_text()
    rows = metrics(run)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    for row in rows:  # every step's episodes were played on both nodes, half each
        assert row["samples_node_0"] == row["samples_node_1"] == 4, row
    assert sorted(path.name for path in (run / "checkpoints").iterdir())[-1] == "step-000004"
    # what the agent did, as the viewer reads it: each step's episodes and agent statistics
    stats = [
        orjson.loads(line)
        for line in (run / "trajectories" / "stats.jsonl").read_bytes().splitlines()
    ]
    assert [row["step"] for row in stats if not row.get("evaluation")] == [1, 2, 3, 4]
    shown = deepdive("trajectories", str(run), "--step", "4", env=job_env)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "step 4 ·" in shown.stdout and "matching episode(s) shown" in shown.stdout
    page = tmp_path / "report.html"
    written = deepdive("trajectories", str(run), "--html", str(page), env=job_env)
    assert written.returncode == 0 and page.stat().st_size > 0, written.stderr
    for node in (0, 1):  # each node served its own worker (the services logged to its folder)
        ready = note(attempt / f"node-{node}.json")
        assert set(ready["services"]) == {"tools", "reward"}
        assert (attempt / f"node-{node}" / "tools.log").is_file()
    # the phases are logged with timestamps, in order, on both nodes
    for node, last in ((0, "training"), (1, "serving")):
        lines = [
            orjson.loads(line)
            for line in (attempt / f"node-{node}.phases.jsonl").read_bytes().splitlines()
        ]
        done = [line["phase"] for line in lines if line["event"] == "done"]
        assert done[:3] == ["secrets", "storage", "ports"] and done[-1] == last, done
        assert [line["t"] for line in lines] == sorted(line["t"] for line in lines)
    # bring-up: node 1 launches its Ray while node 0's head is still coming up (it waited
    # for the head to be up, then took 6-8 s more to join)
    head, joining = phase_times(attempt, 0), phase_times(attempt, 1)
    assert joining[("launch", "done")] < head[("ray", "done")], (joining, head)
    # ... a node checks its services while its Ray still starts (it did after: an HTTP
    # client's import and a request per service added to the join)
    for times in (head, joining):
        assert times[("services", "done")] <= times[("ray", "start")], times
    # ... and node 0's trainer loads its libraries, the data and the policy meanwhile (it
    # started once node 0's services were ready)
    assert head[("trainer_started", "event")] < head[("ray", "done")], head

    # secrets: never in argv, the submitit folder (pickles, sbatch script), the run folder, logs
    assert not [line for line in commands.seen if CANARY_KEY in line or CANARY_TOKEN in line]
    assert len(commands.seen) > 20  # the sampler did see the job's processes
    for path in every_file(run):
        data = path.read_bytes()
        assert CANARY_KEY.encode() not in data and CANARY_TOKEN.encode() not in data, path
    assert CANARY_KEY not in submitted.stdout + submitted.stderr
    # the run and submitit folders are the user's alone
    for folder in (run, run / "submitit"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder

    assert not processes_of_job(job_id)  # nothing of the job outlives it
    assert not ray_temp_dirs(job_id)
    # the teardown of a normal end (Ray's, the services'): it was 15.6 s (Ray's 30 s drain cut
    # by stop_timeout_s 15), and must fit well inside Slurm's KillWait. The bound is a third of
    # Ray's drain, the failure mode (RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S lost), not a
    # measured margin over today's time a loaded machine could overrun.
    times = phase_times(attempt, 0)
    assert times[("job", "end")] - times[("training", "done")] < 10.0, times
    assert (attempt / "node-1" / "ray" / "raylet.out").is_file()  # Ray's session logs, kept

    status = deepdive("status", job_id, env=job_env)  # by job id, through the CLI's index
    assert status.returncode == 0, status.stderr
    assert "finished  yes" in status.stdout and "step      4" in status.stdout
    logs = deepdive("logs", str(run), "--node", "1", env=job_env)
    assert "phase serving done node=1" in logs.stdout
    again = deepdive("submit", *job, env=job_env)  # a finished run does nothing
    assert again.returncode == 0 and "finished already" in again.stdout
    assert len((run / "jobs.jsonl").read_bytes().splitlines()) == 1


def failures(run: Path) -> list[str]:
    """What each failed node of each attempt of `run` wrote (failed-node-K.json's error)."""
    if not (run / "attempts").is_dir():  # not begun yet
        return []
    return [
        failure["error"] for path in attempts(run) for failure in AttemptFolder(path).failures()
    ]


def ended(run: Path) -> bool:
    """The run finished or one of its nodes failed."""
    return (run / "finished.json").is_file() or bool(failures(run))


def test_a_preempted_job_resumes_and_ends_as_an_uninterrupted_one(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    """Two jobs (no port collision, both finish); one gets the warning signal mid-training
    (SIGURG, 23: what Slurm sends before the time limit, slurm/requeue.py): node 0 asks for the
    requeue, the batch script makes it once srun returns, the job resumes from its last
    checkpoint, and its final model is the uninterrupted one's. The second job is submitted once
    the first trains: four Ray nodes starting at once on this 2-core host take more than the
    15 s a raylet waits for its dashboard agent (measured 12 s for the agent's imports alone),
    and Ray then aborts; one node per host, as on a cluster, never meets that."""
    steps = 40  # long enough that the signal lands mid-training (a step takes 0.1-0.2 s)
    preempted, steady = tmp_path / "preempted", tmp_path / "steady"
    second = submit(tiny_job(steady, steps), job_env)
    wait_until(
        lambda: ended(steady) or newest_checkpoint(steady / "checkpoints") >= 1,
        JOB_TIMEOUT_S,
        "the steady job to train",
    )
    first = submit(tiny_job(preempted, steps), job_env)
    wait_until(
        lambda: ended(preempted) or newest_checkpoint(preempted / "checkpoints") >= 2,
        JOB_TIMEOUT_S,
        "a checkpoint at step 2",
    )
    assert not failures(preempted), failures(preempted)
    subprocess.run(["scancel", f"--signal={int(signal.SIGURG)}", first], env=job_env, check=True)
    # a requeued job may be out of squeue for a moment between its attempts: finished.json (or
    # a node's failure) says it ended, the queue only that its processes are gone
    wait_until(lambda: ended(preempted) and ended(steady), JOB_TIMEOUT_S, "both jobs to end")
    assert not failures(preempted) and not failures(steady)
    wait_until(
        lambda: job_left_queue(first, job_env) and job_left_queue(second, job_env),
        JOB_TIMEOUT_S,
        "both jobs to leave the queue",
    )
    for run in (preempted, steady):
        assert (run / "finished.json").is_file(), run
    assert job_fields(first, job_env)["Restarts"] == "1"
    one, two = attempts(preempted)
    assert (one.name, two.name) == (f"{first}-0", f"{first}-1")
    assert note(one / "end.json")["requeue"] is True
    assert note(one / "requeue-asked.json")["job_id"] == first  # by submitit, in the task
    assert note(one / "requeue-answer.json")["requeued"] is True  # by the batch script
    assert "resumed from" in (two / "node-0.log").read_text()
    assert [row["step"] for row in metrics(preempted)] == list(range(1, steps + 1))
    assert len(attempts(steady)) == 1
    # the two jobs' nodes listened on different ports
    ports = [
        set(note(attempts(run)[0] / f"node-{node}.json")["ports"].values())
        for run in (preempted, steady)
        for node in (0, 1)
    ]
    assert all(not (a & b) for i, a in enumerate(ports) for b in ports[i + 1 :])
    a, b = weights(preempted / "final_model"), weights(steady / "final_model")
    assert set(a) == set(b)
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5), name
    for row_a, row_b in zip(metrics(preempted), metrics(steady), strict=True):
        assert row_a["reward_mean"] == row_b["reward_mean"]


def test_a_warned_job_saves_at_the_next_step_and_resumes_there(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    """A job warned after step 3 with no periodic checkpoint due (local.checkpoint.every is
    past the end): node 0 forwards the warning to the trainer, which saves at the next step's
    end; the requeue waits for that save and the next attempt resumes there, not at step 0
    (slurm/node/preemption.py). `deepdive status` says what the warning saved and what was lost."""
    steps = 40
    run = tmp_path / "warned"
    job = submit(tiny_job(run, steps, "local.checkpoint.every=1000"), job_env)
    logged = run / "logs" / "metrics.jsonl"
    wait_until(
        lambda: ended(run) or (logged.is_file() and len(metrics(run)) >= 3),
        JOB_TIMEOUT_S,
        "step 3",
    )
    assert not failures(run), failures(run)
    subprocess.run(["scancel", f"--signal={int(signal.SIGURG)}", job], env=job_env, check=True)
    wait_until(lambda: ended(run), JOB_TIMEOUT_S, "the job to end")
    assert not failures(run), failures(run)
    assert (run / "finished.json").is_file()
    one, two = attempts(run)
    resumed = re.search(r"resumed from \S+ at step (\d+)", (two / "node-0.log").read_text())
    assert resumed, (two / "node-0.log").read_text()
    assert int(resumed.group(1)) > 3  # not step 0, the only checkpoint before the warning
    warning = note(one / "end.json")["warning"]
    assert warning["save"] == "saved", warning
    assert warning["saved_step"] > 3  # the step after the warning, not a periodic one
    assert int(resumed.group(1)) >= warning["saved_step"]
    assert [row["step"] for row in metrics(run)] == list(range(1, steps + 1))
    status = deepdive("status", str(run), env=job_env)
    assert f"attempt {one.name}: saved step {warning['saved_step']}" in status.stdout, status


def test_a_node_that_cannot_start_its_services_fails_the_job_fast(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    """Fast: node 0 hears of node 1's failure and ends the job, long before it would have given
    up waiting for node 1 (join_timeout_s, 300 s here: the bound is a third of it)."""
    run = tmp_path / "run"
    job = tiny_job(run, 4, "bootstrap.join_timeout_s=300")
    job_id = submit(job, {**job_env, "DEEPDIVE_DRILL": "services@1"})
    wait_until(lambda: job_left_queue(job_id, job_env), 100, "the failed job to end")
    fields = job_fields(job_id, job_env)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] != "0:0", fields
    (attempt,) = attempts(run)
    failure = note(attempt / "failed-node-1.json")
    assert (failure["node"], failure["phase"]) == (1, "services")
    assert "exited with status" in failure["error"]
    head = (attempt / "node-0.log").read_text()
    assert "node 1 failed during services" in head
    status = deepdive("status", str(run), env=job_env)
    assert "FAILED    node 1 during services" in status.stdout
    assert not (run / "finished.json").exists()
    wait_until(lambda: not processes_of_job(job_id), 15, "the job's processes to be gone")
    assert os.path.isdir(run / "attempts")


def test_cancelling_a_run_ends_its_job_and_leaves_nothing_running(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    """Also: an actor's print and traceback on node 1 are kept in the attempt folder, no Ray
    process or temp dir outlives the job (Ray ends within Slurm's KillWait, 5 s here), and the
    stop reads as the bootstrap's own line, no stack dumps."""
    run = tmp_path / "run"
    job_id = submit(tiny_job(run, 400), job_env)
    wait_until(lambda: (run / "logs" / "metrics.jsonl").is_file(), JOB_TIMEOUT_S, "training")
    (attempt,) = attempts(run)
    driver = subprocess.run(
        [sys.executable, "-c", FAILING_ACTOR, note(attempt / "head.json")["address"]],
        env=job_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert "driver saw ActorDiedError" in driver.stdout, driver.stdout + driver.stderr
    # every socket the job listens on is on loopback (cluster-tiny's bootstrap.node_address
    # and services.host), read from the kernel's tables for the job's processes: Ray's node
    # address (its runtime env agent listened on this host's interface before), the services
    listening = listeners_of_job(job_id)
    ready = [note(attempt / f"node-{node}.json") for node in (0, 1)]
    ports = {port for _, _, port in listening}
    for node in ready:  # the sampler saw the servers: Ray's, the services' (every worker)
        assert node["ray"].rsplit(":", 1)[1] in {str(port) for port in ports}, listening
        assert {node["ports"]["reward"], node["ports"]["ray_runtime_env_agent"]} <= ports, listening
    ray_own = ray_wildcard_ports(attempt, 2)
    beyond = [
        item
        for item in listening
        if not on_loopback(item[1]) and not (item[1] in WILDCARDS and item[2] in ray_own)
    ]
    assert not beyond, beyond
    cancelled = deepdive("cancel", str(run), env=job_env)
    assert cancelled.returncode == 0 and f"cancelled job {job_id}" in cancelled.stdout
    wait_until(lambda: job_left_queue(job_id, job_env), 60, "the cancelled job to end")
    assert job_fields(job_id, job_env)["JobState"] == "CANCELLED"
    assert not (run / "finished.json").exists()
    # the services, Ray and the trainer went with SIGTERM; the bootstraps with Slurm's SIGKILL
    assert not ray_temp_dirs(job_id)  # removed before Slurm's SIGKILL, which ends the job
    wait_until(lambda: not processes_of_job(job_id), 30, "the job's processes to be gone")
    assert not list(attempt.glob("failed-node-*.json"))  # a cancel is not a failure
    kept = "".join(
        path.read_text(errors="replace")
        for path in (attempt / "node-1" / "ray").glob("worker-*")
        if path.is_file()
    )
    assert "actor-on-node-1 says hello" in kept
    assert "ValueError: actor-on-node-1 breaks" in kept and "in __init__" in kept  # its traceback
    console = (attempt / "node-0.log").read_text()
    assert console.count("SIGTERM: Slurm is ending the job") == 1
    assert "SIGTERM received" not in console and "logging.cc" not in console


def test_a_node_whose_bootstrap_is_killed_is_named_and_leaves_nothing_running(
    job_env: dict[str, str], tmp_path: Path
) -> None:
    """Node 1's bootstrap SIGKILLed while it serves: srun ends the job, node 0 names node 1
    and its phase in a failure note, which `deepdive status` shows (Slurm's own record says
    only "task 1: Killed", and forgets the job)."""
    run = tmp_path / "run"
    job_id = submit(tiny_job(run, 400), job_env)
    wait_until(lambda: (run / "logs" / "metrics.jsonl").is_file(), JOB_TIMEOUT_S, "training")
    (bootstrap,) = [
        int(line.split(":", 1)[0])
        for line in processes_of_job(job_id)
        if "submitit.core._submit" in line
        and b"SLURM_NODEID=1"
        in Path(f"/proc/{line.split(':', 1)[0]}/environ").read_bytes().split(b"\0")
    ]
    os.kill(bootstrap, signal.SIGKILL)
    wait_until(lambda: job_left_queue(job_id, job_env), 60, "the job to end")
    assert job_fields(job_id, job_env)["JobState"] == "FAILED"
    (attempt,) = attempts(run)
    failure = note(attempt / "failed-node-1.json")
    assert (failure["node"], failure["phase"], failure["reported_by"]) == (1, "serving", 0)
    status = deepdive("status", str(run), env=job_env)
    assert "FAILED    node 1 during serving: it ended without a word" in status.stdout
    assert not ray_temp_dirs(job_id)  # node 1's Ray ended with its keeper
    wait_until(lambda: not processes_of_job(job_id), 30, "the job's processes to be gone")


def test_the_test_clusters_slurm_listens_on_loopback(slurm_env: dict[str, str]) -> None:
    """slurmctld and each slurmd bind 127.0.0.1 (scripts/local-slurm.sh: NoInAddrAny, where
    this host's name resolves there), not every address; srun's are checked with a job's."""
    if socket.gethostbyname(socket.gethostname()) != "127.0.0.1":
        pytest.skip("this host's name does not resolve to 127.0.0.1: Slurm binds every address")
    pid_files = sorted((Path(slurm_env["DEEPDIVE_SLURM_DIR"]) / "slurm" / "run").glob("*.pid"))
    assert len(pid_files) == 3, pid_files  # slurmctld, slurmd-n1, slurmd-n2
    listening = {path.name: listening_sockets(int(path.read_text())) for path in pid_files}
    assert all(listening.values()), listening
    assert all(on_loopback(host) for found in listening.values() for host, _ in found), listening
