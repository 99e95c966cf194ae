"""`deepdive submit` on two real hosts: the cluster-tiny training (local backend) on the 2-host
container cluster (scripts/two-hosts.sh), every task inside the CPU SIF (`apptainer exec` on each
node, as the sbatch script says), the run folder on the shared volume. The emulated-node tests
(tests/slurm) share one host, one IP and the checkout's venv; here the nodes share only the
network and the volume, so whatever crosses between them crosses the network.

Two jobs, both with the launcher's defaults for an image (the SIF mounted by Apptainer's
unprivileged squashfuse, no Slurm client inside it). The main one trains, gets Slurm's warning
signal once a checkpoint exists (SIGURG, slurm/requeue.py), requeues and resumes; while it runs,
each node's services are called from the other node by address and each node's TCP peers are
read. The other has node 1's bootstrap SIGKILLed mid-training."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from slurm.node.phases import read_phases
from tests.helpers import newest_checkpoint, wait_until

pytestmark = pytest.mark.slow

ENV = "DEEPDIVE_TWO_HOSTS"
USER = "ci"  # uid 1000 on every host: Apptainer runs inside podman only as a non-root user
CONFIG = "/src/configs/cluster-tiny.toml"  # the checkout, bound read-only on ctl
HOST_NUMBERS = {"ctl": 10, "n1": 11, "n2": 12}  # each host's address in the cluster's /24


@dataclass(frozen=True)
class TwoHosts:
    """The cluster scripts/two-hosts.sh brought up (its cluster.env, named by DEEPDIVE_TWO_HOSTS):
    ctl (slurmctld, the login host), n1 and n2 (slurmd, Apptainer), podman containers. Without
    it these tests skip, saying so; `make ci-two-hosts` (run by .ci/run) brings it up."""

    prefix: str
    net: str  # the /24's first three numbers
    sif: str  # the CPU SIF, at the same path on every host
    shared: Path  # the shared volume, as this host sees it (/shared in the containers)
    logs: Path  # Slurm's logs, a folder per host

    def address(self, host: str) -> str:
        return f"{self.net}.{HOST_NUMBERS[host]}"

    def run(
        self, host: str, *command: str, user: str | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`command` on `host` (a container of the cluster), as root or `user`."""
        who = ["--user", user, "--workdir", f"/home/{user}"] if user else []
        return subprocess.run(
            ["podman", "exec", "-i", *who, f"{self.prefix}-{host}", *command],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
        )

    def slurm(self, *command: str) -> str:
        result = self.run("ctl", *command, user=USER)
        assert result.returncode == 0, f"{' '.join(command)}: {result.stderr}"
        return result.stdout

    def in_queue(self, job_id: str) -> bool:
        return bool(self.slurm("squeue", "-h", "-j", job_id, "-o", "%T").strip())

    def job_fields(self, job_id: str) -> dict[str, str]:
        out = self.slurm("scontrol", "-o", "show", "job", job_id)
        return dict(item.split("=", 1) for item in out.split() if "=" in item)

    def slurm_logs(self) -> str:
        """Every host's Slurm log, for a failure's message."""
        return "\n".join(
            f"== {path}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.logs.glob("*/*.log"))
        )


@pytest.fixture(scope="module")
def cluster() -> TwoHosts:
    path = os.environ.get(ENV)
    if not path:
        pytest.skip(f"no 2-host cluster: `make ci-two-hosts` brings one up ({ENV} unset)")
    values = dict(line.split("=", 1) for line in Path(path).read_text().splitlines() if "=" in line)
    return TwoHosts(
        prefix=values["TWO_HOSTS_PREFIX"],
        net=values["TWO_HOSTS_NET"],
        sif=values["TWO_HOSTS_SIF"],
        shared=Path(values["TWO_HOSTS_SHARED"]),
        logs=Path(values["TWO_HOSTS_LOGS"]),
    )


# long enough that the warning signal lands mid-training on a fast machine: a step takes 0.16 s
# to 0.3 s here, so 40 steps could end before the warning (CI on 6cd6606); a checkpoint every
# 2 steps, the newest 2 kept
STEPS = 300
SAMPLES_PER_NODE = 4  # cluster-tiny: 2 prompts x 4 samples a step, a group per node
JOB_TIMEOUT_S = 600
KEYS = "/shared/keys/two-hosts.env"


def timed(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """tests.helpers.wait_until, and the seconds it took."""
    started = time.monotonic()
    wait_until(condition, timeout_s, what)
    return time.monotonic() - started


def say(text: str) -> None:
    """A line of what the job took, in the CI log (pytest -s)."""
    print(f"two-hosts: {text}", flush=True)


def note(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def attempts(run: Path) -> list[Path]:
    return sorted(path for path in (run / "attempts").iterdir() if path.is_dir())


# Slurm's warning before the time limit, as the sbatch script asks for it (--signal=23@...):
# SIGURG, by number (Slurm 22.05 knows no name URG)
WARNING = str(int(signal.SIGURG))


def submit(cluster: TwoHosts, name: str, steps: int) -> tuple[str, Path]:
    """Submit cluster-tiny from the login host, as a user would, into a new run folder (a
    cluster that stays up can run the tests again); the job id and the run folder as this host
    sees it. The env file's folder is bound (the nodes read it); nothing else is: no Slurm
    client, no option (Apptainer mounts the SIF with squashfuse)."""
    name = f"{name}-{secrets.token_hex(3)}"
    binds = ["/shared/keys"]
    result = cluster.run(
        "ctl",
        "deepdive",
        "submit",
        CONFIG,
        *("--set", f'run.folder="/shared/runs/{name}"'),
        *("--set", f"local.grpo.steps={steps}"),
        *("--set", f'container.image="{cluster.sif}"'),
        *("--set", "container.nv=false"),  # no GPU driver to bring in
        *("--set", f"container.binds={json.dumps(binds)}"),
        *("--set", 'services.host="0.0.0.0"'),  # answer the other node (the token guards it)
        *("--set", 'bootstrap.node_address="route"'),  # two hosts: not cluster-tiny's loopback
        *("--set", f'services.env_file="{KEYS}"'),
        user=USER,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = re.search(r"submitted job (\d+)", result.stdout)
    assert found, result.stdout
    return found.group(1), cluster.shared / "runs" / name


def ready_note(run: Path, node: int) -> dict[str, Any] | None:
    """node-K.json of the run's first attempt, once the node is ready."""
    found = sorted((run / "attempts").glob(f"*/node-{node}.json"))
    return note(found[0]) if found else None


def http_get(cluster: TwoHosts, host: str, url: str, token: str | None) -> str:
    """GET `url` from `host` (bash's /dev/tcp: no client on the nodes); the status line. The
    request travels on stdin, so the token never reaches an argv."""
    found = re.fullmatch(r"http://([0-9.]+):(\d+)/?", url)
    assert found, url
    address, port = found.groups()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    request = f"GET /ready HTTP/1.1\r\nHost: {address}:{port}\r\n{auth}Connection: close\r\n\r\n"
    result = cluster.run(
        host,
        "bash",
        "-c",
        'exec 3<>"/dev/tcp/$1/$2" && cat >&3 && cat <&3',
        "_",
        address,
        port,
        stdin=request,
    )
    assert result.returncode == 0, f"{host} -> {url}: {result.stderr}"
    return result.stdout.splitlines()[0] if result.stdout else ""


@dataclass
class Preempted:
    job_id: str
    run: Path
    nodes: dict[int, dict[str, Any]]  # node-K.json of the first attempt
    calls: dict[str, str] = field(default_factory=dict)  # "from -> url (token?)": status line
    ray_peers: dict[str, list[str]] = field(default_factory=dict)  # host: its TCP peers
    warned_at_step: int = 0


@pytest.fixture(scope="module")
def keys(cluster: TwoHosts) -> str:
    """The service token, in an env file on the shared volume that only the job's user reads."""
    token = secrets.token_hex(16)
    path = cluster.shared / "keys" / Path(KEYS).name
    path.write_text(f"DEEPDIVE_SERVICE_TOKEN={token}\n")
    path.chmod(0o600)
    os.chown(path, 1000, 1000)
    return token


def tcp_peers(cluster: TwoHosts, host: str) -> list[str]:
    """The ADDRESS:PORT at the other end of every established TCP connection of `host`."""
    result = cluster.run(host, "ss", "-Htn", "state", "established")
    assert result.returncode == 0, result.stderr
    return [
        line.split()[-1].removeprefix("[::ffff:").replace("]", "")
        for line in result.stdout.splitlines()
    ]


def preempt(
    cluster: TwoHosts, name: str, while_ready: Callable[[Preempted], None] | None = None
) -> Preempted:
    """cluster-tiny for STEPS steps; `while_ready(seen)` once both nodes are ready; Slurm's
    warning signal once step 2's checkpoint exists; then it should requeue, resume and finish."""
    job_id, run = submit(cluster, name, STEPS)
    try:
        took = timed(
            lambda: all(ready_note(run, node) for node in (0, 1)), 300, "both nodes to be ready"
        )
    except AssertionError:
        raise AssertionError(f"both nodes were not ready:\n{cluster.slurm_logs()}") from None
    say(f"job {job_id}: both nodes ready {took:.1f} s after submission")
    seen = Preempted(job_id, run, {node: ready_note(run, node) or {} for node in (0, 1)})
    if while_ready is not None:
        while_ready(seen)
    checkpoints = run / "checkpoints"
    took = timed(lambda: newest_checkpoint(checkpoints) >= 2, 300, "a checkpoint at step 2")
    seen.warned_at_step = len((run / "logs" / "metrics.jsonl").read_bytes().splitlines())
    cluster.slurm("scancel", f"--signal={WARNING}", job_id)
    say(f"job {job_id}: SIGURG at step {seen.warned_at_step}, {took:.1f} s after both were ready")
    took = timed(lambda: not cluster.in_queue(job_id), JOB_TIMEOUT_S, "the job to end")
    say(f"job {job_id}: left the queue {took:.1f} s after SIGURG")
    return seen


@pytest.fixture(scope="module")
def preempted(cluster: TwoHosts, keys: str) -> Preempted:
    """The main job: while it runs, each node's services are called from the other node and
    each node's TCP peers are read; then the warning signal, a requeue and the rest of the
    training, all with the launcher's defaults for an image."""

    def calls_and_peers(seen: Preempted) -> None:
        hosts = {node: seen.nodes[node]["host"] for node in (0, 1)}
        for node in (0, 1):
            other = hosts[1 - node]
            for urls in seen.nodes[node]["services"].values():  # each service's workers
                url = urls[0]
                seen.calls[f"{other} -> {url} with the token"] = http_get(cluster, other, url, keys)
                seen.calls[f"{other} -> {url} without"] = http_get(cluster, other, url, None)
        for host in hosts.values():
            seen.ray_peers[host] = tcp_peers(cluster, host)

    return preempt(cluster, "preempted", while_ready=calls_and_peers)


def test_the_job_ran_inside_the_sif_on_two_hosts(cluster: TwoHosts, preempted: Preempted) -> None:
    script = preempted.run / "submitit" / preempted.job_id / f"{preempted.job_id}_submission.sh"
    text = script.read_text()
    assert f"apptainer exec --bind /shared/runs/{preempted.run.name} --bind /dev/shm" in text
    assert f"{cluster.sif} python3 -u -m submitit.core._submit" in text, text
    assert {preempted.nodes[0]["host"], preempted.nodes[1]["host"]} == {"n1", "n2"}
    for host in ("n1", "n2"):  # nothing of the project on a node: only the SIF can have run it
        assert cluster.run(host, "test", "-e", "/opt/venv").returncode == 1


def test_ray_joined_over_the_containers_addresses(cluster: TwoHosts, preempted: Preempted) -> None:
    head_host = preempted.nodes[0]["host"]
    head = f"{cluster.address(head_host)}:{preempted.nodes[0]['ports']['ray_gcs']}"
    first = attempts(preempted.run)[0]
    for node in (0, 1):
        host = preempted.nodes[node]["host"]
        assert preempted.nodes[node]["ray"] == head, preempted.nodes[node]
        ray_log = (first / f"node-{node}" / "ray.log").read_text()
        assert f"Local node IP: {cluster.address(host)}" in ray_log, ray_log
    assert not head.startswith("127.")
    # the other node's raylet holds connections to the head's GCS, over the network
    other = preempted.nodes[1]["host"]
    assert head in preempted.ray_peers[other], preempted.ray_peers


def test_each_nodes_services_answer_the_other_node_by_address(
    cluster: TwoHosts, preempted: Preempted
) -> None:
    for node in (0, 1):
        address = cluster.address(preempted.nodes[node]["host"])
        assert set(preempted.nodes[node]["services"]) == {"tools", "reward"}
        for urls in preempted.nodes[node]["services"].values():
            assert urls and all(url.startswith(f"http://{address}:") for url in urls), urls
    assert len(preempted.calls) == 8, preempted.calls
    for call, status in preempted.calls.items():
        expected = "200" if call.endswith("with the token") else "401"
        assert status.split()[1:2] == [expected], (call, status)


def test_every_step_has_rollout_samples_from_both_nodes(preempted: Preempted) -> None:
    rows = [
        orjson.loads(line)
        for line in (preempted.run / "logs" / "metrics.jsonl").read_bytes().splitlines()
    ]
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    for row in rows:
        assert row["samples_node_0"] == row["samples_node_1"] == SAMPLES_PER_NODE, row


def test_a_requeue_inside_the_image_resumes_from_its_checkpoint(
    cluster: TwoHosts, preempted: Preempted
) -> None:
    """With the launcher's defaults: the SIF mounted by squashfuse survives the warning signal
    (SIGURG), and submitit's `scontrol requeue`, inside the image where there is no Slurm
    client, is made by the batch script on the host once every node has stopped."""
    fields = cluster.job_fields(preempted.job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("COMPLETED", "1"), fields
    assert (preempted.run / "finished.json").is_file()
    one, two = attempts(preempted.run)
    assert (one.name, two.name) == (f"{preempted.job_id}-0", f"{preempted.job_id}-1")
    assert note(one / "end.json")["requeue"] is True
    assert note(one / "requeue-asked.json")["job_id"] == preempted.job_id  # the stand-in
    assert note(one / "requeue-answer.json")["requeued"] is True  # the batch script
    assert 2 <= preempted.warned_at_step < STEPS
    assert "resumed from" in (two / "node-0.log").read_text()
    for node in (0, 1):  # the second attempt ran on both hosts again
        assert note(two / f"node-{node}.json")["host"] in {"n1", "n2"}
    # every node stopped on its own (no signal tore a node down with its image)
    for node in (0, 1):
        events = [line["event"] for line in read_phases(one / f"node-{node}.phases.jsonl")]
        assert "children_stopped" in events, events
    logs = "\n".join(path.read_text(errors="replace") for path in one.glob("node-*.log"))
    for sign in ("Bus error", "Transport endpoint is not connected", "No module named"):
        assert sign not in logs, sign


def job_leftovers(cluster: TwoHosts, job_id: str) -> dict[str, str]:
    """On each node: the job's Ray temp dirs (/tmp/dd-JOB-K) and any process still carrying
    the job's id in its environment."""
    found = {}
    for host in ("n1", "n2"):
        result = cluster.run(
            host,
            "bash",
            "-c",
            'ls -d /tmp/dd-"$1"-* 2>/dev/null; for d in /proc/[0-9]*; do tr "\\0" "\\n" '
            '<"$d/environ" 2>/dev/null | grep -qx "SLURM_JOB_ID=$1" && tr "\\0" " " '
            '<"$d/cmdline"; done; true',
            "_",
            job_id,
        )
        found[host] = result.stdout.strip()
    return found


def test_a_cancel_inside_the_image_still_stops_every_node(cluster: TwoHosts, keys: str) -> None:
    """SIGTERM, which Slurm sends at a cancel, a preemption or the time limit and which no
    option changes, makes Apptainer's squashfuse unmount the image under the job: each node's
    teardown needs nothing new from the image, so it still stops its children, copies Ray's
    logs and removes Ray's temp dir; the processes may die of SIGBUS on their way out (counted
    here, docs/cluster.md)."""
    job_id, run = submit(cluster, "cancelled", 400)
    timed(lambda: (run / "logs" / "metrics.jsonl").is_file(), 300, "training")
    cluster.slurm("scancel", job_id)
    took = timed(lambda: not cluster.in_queue(job_id), 120, "the cancelled job to end")
    assert cluster.job_fields(job_id)["JobState"] == "CANCELLED"
    (attempt,) = attempts(run)
    for node in (0, 1):
        events = [line["event"] for line in read_phases(attempt / f"node-{node}.phases.jsonl")]
        assert "children_stopped" in events, (node, events)
        assert (attempt / f"node-{node}" / "ray").is_dir()  # Ray's session logs, copied
    assert not (attempt / "requeue-asked.json").exists()  # a cancel is not a requeue
    wait_until(lambda: not any(job_leftovers(cluster, job_id).values()), 30, "the job's leftovers")
    status = cluster.run("ctl", "deepdive", "status", f"/shared/runs/{run.name}", user=USER)
    assert "FAILED" not in status.stdout, status.stdout
    raw = "\n".join(
        path.read_text(errors="replace")
        for path in [*(run / "submitit" / job_id).glob("*_log.err"), *attempt.glob("node-*.log")]
    )
    say(
        f"job {job_id}: cancelled, left the queue {took:.1f} s later, every node stopped; "
        f"{raw.count('Bus error')} 'Bus error' line(s) in its logs"
    )


@dataclass
class Killed:
    job_id: str
    run: Path
    host: str  # node 1's host
    ended_after_s: float
    status: str  # `deepdive status RUN` afterwards


@pytest.fixture(scope="module")
def killed(cluster: TwoHosts, keys: str) -> Killed:
    """A long cluster-tiny whose node 1 bootstrap is SIGKILLed once training has begun (not the
    failure drill: the process dies as a crashed or OOM-killed one would)."""
    job_id, run = submit(cluster, "killed", 400)
    took = timed(lambda: (run / "logs" / "metrics.jsonl").is_file(), 300, "training")
    say(f"job {job_id}: training {took:.1f} s after submission")
    host = (ready_note(run, 1) or {})["host"]
    found = cluster.run(
        host,
        "bash",
        "-c",
        # the bootstrap is the task's python (inside the SIF, same PID namespace): its
        # environment names the job, its command line is submitit's
        'for d in /proc/[0-9]*; do tr "\\0" "\\n" <"$d/environ" 2>/dev/null | grep -qx '
        '"SLURM_JOB_ID=$1" || continue; c=$(tr "\\0" " " <"$d/cmdline" 2>/dev/null); '
        '[[ $c == *"python3 -u -m submitit.core._submit "* && $c != Apptainer* ]] && echo "${d#/proc/}"; done',
        "_",
        job_id,
    )
    pids = found.stdout.split()
    assert len(pids) == 1, (found.stdout, found.stderr)
    killed_at = time.monotonic()
    assert cluster.run(host, "kill", "-KILL", pids[0]).returncode == 0
    wait_until(lambda: not cluster.in_queue(job_id), 300, "the job to end")
    ended_after_s = time.monotonic() - killed_at
    say(f"job {job_id}: left the queue {ended_after_s:.1f} s after node 1 was SIGKILLed")
    status = cluster.run("ctl", "deepdive", "status", f"/shared/runs/{run.name}", user=USER)
    return Killed(job_id, run, host, ended_after_s, status.stdout + status.stderr)


def test_a_sigkilled_node_fails_the_job_fast(cluster: TwoHosts, killed: Killed) -> None:
    fields = cluster.job_fields(killed.job_id)
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] != "0:0", fields
    # a job that missed the death would run 400 steps, up to its 10-minute limit
    assert killed.ended_after_s < 120, killed.ended_after_s
    assert not (killed.run / "finished.json").exists()
    raw = (killed.run / "submitit" / killed.job_id / f"{killed.job_id}_0_log.err").read_text()
    assert f"srun: error: {killed.host}: task 1: Killed" in raw, raw[-2000:]


def test_a_sigkilled_node_is_named_by_status(killed: Killed) -> None:
    """Node 0 finds node 1's phase log without a word after Slurm ended the job and writes the
    failure note node 1 could not; status reads it long after Slurm forgets the job."""
    assert re.search(r"FAILED\s+node 1 during \w+: it ended without a word", killed.status), (
        killed.status
    )
