"""Step 2: collectives, as the trainer's will run them.

- NCCL on this node: one rank per GPU, an all-reduce checked for its result and timed (bus
  bandwidth as nccl-tests reports it), the transport read from NCCL's own log
  (NCCL_DEBUG=INFO: "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM");
- NCCL across nodes: every GPU of every node in one all-reduce; the log must show a network
  transport (NET/IB, NET/Socket) between the nodes;
- gloo (what slime's CPU groups use) over the chosen interface: two processes per node.

Every rank runs in a process of its own (slurm.smoke.collective_worker) with the training
backend's environment (the interfaces the job will use), its output in a log file per rank.
Node 0 publishes the address of each group's store in the kit's folder.
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import struct
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.base.process import child_preexec, log_tail
from services.base.waiting import WaitTimeout, wait_for
from slurm.backends import build_backend
from slurm.node.network import ROUTE, node_address
from slurm.run_folder import read_json
from slurm.smoke.context import SmokeContext
from slurm.smoke.gpus import no_gpu, torch_gpus
from slurm.smoke.report import Check, failed, passed

NCCL_BYTES = 256 * 2**20
GLOO_BYTES = 16 * 2**20
GLOO_RANKS_PER_NODE = 2
RANK_TIMEOUT_S = 300.0  # joining the group and every call
NOTE_TIMEOUT_S = 900.0  # how long a node waits for the others to reach the same part
SIOCGIFADDR = 0x8915

# "NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read" (older NCCL: "Channel 00 :",
# bus ids in the brackets, "[send]" / "[receive]" before "via" on network links)
CHANNEL = re.compile(
    r"NCCL INFO Channel \d+(?:/\d+)? : \d+\[[0-9a-fA-F]+\] -> \d+\[[0-9a-fA-F]+\]"
    r"(?: \[(?:send|receive)\])? via (\S+)"
)
NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
VERSION = re.compile(r"NCCL version (\S+)")
WARNING = re.compile(r"NCCL WARN (.+)")


# -- what NCCL's log and the ranks say (pure) -----------------------------------------------


def transports(log: str) -> Counter[str]:
    """How many channel connections went over each transport."""
    return Counter(match.group(1) for match in CHANNEL.finditer(log))


def describe_transports(seen: Counter[str]) -> str:
    return ", ".join(f"{name} x{count}" for name, count in sorted(seen.items()))


def network_transports(seen: Counter[str]) -> list[str]:
    return sorted(name for name in seen if name.startswith("NET/"))


def nccl_facts(log: str) -> str:
    """NCCL's version and the network it chose, as its log says."""
    facts = []
    if version := VERSION.search(log):
        facts.append(f"NCCL {version.group(1)}")
    networks = sorted(set(NETWORK.findall(log)))
    if networks:
        facts.append(f"network {'/'.join(networks)}")
    return ", ".join(facts)


def bus_bandwidth(size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algorithm bandwidth, bus bandwidth) of an all-reduce in GB/s, as nccl-tests computes
    them: size / time, and that times 2 (n - 1) / n, what each link carries."""
    algorithm = size_bytes / seconds / 1e9
    return algorithm, algorithm * 2 * (world - 1) / world


def measured(result: dict[str, Any]) -> str:
    world, size, seconds = int(result["world"]), int(result["bytes"]), result["seconds_per_call"]
    algorithm, bus = bus_bandwidth(size, float(seconds), world)
    return (
        f"all-reduce of {size / 2**20:.0f} MiB over {world} rank(s): bus bandwidth "
        f"{bus:.1f} GB/s (algorithm {algorithm:.1f} GB/s, {float(seconds) * 1e3:.2f} ms a call)"
    )


# -- the chosen interface --------------------------------------------------------------------


def interface_of(address: str) -> str | None:
    """The network interface that holds `address` (Linux), or None."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                packed = fcntl.ioctl(
                    probe.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:
                continue
        if socket.inet_ntoa(packed[20:24]) == address:
            return name
    return None


def chosen_interface(
    environment: dict[str, str], address: str, one_host: bool = False
) -> tuple[str, str | None]:
    """The interface gloo is told to use: the backend's GLOO_SOCKET_IFNAME, else the one
    holding the node's address; and why it cannot serve, if it cannot. `one_host`: the
    experiment pins every node to a loopback address (bootstrap.node_address, nodes emulated
    on one host, where the bootstrap fails a node on another host), so loopback serves."""
    if named := environment.get("GLOO_SOCKET_IFNAME"):
        return named, None
    if address.startswith("127.") and not one_host:
        return "lo", f"the node's address is {address}, a loopback one: other nodes cannot reach it"
    if address.startswith("127."):
        return "lo", None
    found = interface_of(address)
    if found is None:
        return "", f"no network interface holds the node's address {address}"
    return found, None


# -- ranks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Group:
    """One all-reduce group as this node takes part in it."""

    name: str  # its logs and result: NAME-rank-R.log, NAME.json
    backend: str  # nccl | gloo
    first: int  # this node's first global rank
    local: int  # this node's ranks
    world: int
    master: str  # ADDRESS:PORT of rank 0's store
    size: int  # bytes per call
    result: Path  # rank 0 writes it (node 0's folder, which every node sees)


def worker_command(python: str, group: Group, local_rank: int) -> list[str]:
    return [
        python, "-m", "slurm.smoke.collective_worker",
        "--backend", group.backend,
        "--rank", str(group.first + local_rank),
        "--world", str(group.world),
        "--local-rank", str(local_rank),
        "--master", group.master,
        "--bytes", str(group.size),
        "--timeout-s", f"{RANK_TIMEOUT_S:g}",
        "--result", str(group.result),
    ]  # fmt: skip


@dataclass(frozen=True)
class GroupRun:
    codes: list[int | None]  # None: stopped at the deadline
    logs: list[Path]
    result: dict[str, Any] | None

    def log_text(self) -> str:
        return "\n".join(path.read_text(errors="replace") for path in self.logs if path.exists())

    def failure(self) -> str | None:
        """Why the group failed, naming the first rank that did."""
        for path, code in zip(self.logs, self.codes, strict=True):
            if code == 0:
                continue
            status = "did not finish in time" if code is None else f"exited with status {code}"
            warnings = WARNING.findall(path.read_text(errors="replace")) if path.exists() else []
            said = f"NCCL WARN {warnings[-1]}" if warnings else log_tail(path, 5)
            return f"{path.stem} {status} ({path}): {said}"
        if self.result is None:
            return "rank 0 wrote no result"
        if not self.result.get("correct"):
            return "the all-reduce summed wrong: a rank received corrupted data"
        return None


def run_group(python: str, group: Group, folder: Path, environment: dict[str, str]) -> GroupRun:
    logs = [folder / f"{group.name}-rank-{group.first + index}.log" for index in range(group.local)]
    processes = []
    for index, log in enumerate(logs):
        with log.open("wb") as out:
            processes.append(
                subprocess.Popen(  # noqa: S603 (our own module, fixed arguments)
                    worker_command(python, group, index),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **environment},
                    preexec_fn=child_preexec,
                )
            )
    deadline = time.monotonic() + RANK_TIMEOUT_S + 60
    codes: list[int | None] = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            codes.append(None)
    result = None
    if all(code == 0 for code in codes):
        try:  # rank 0 wrote it on node 0 before it exited; shared storage may lag a little
            result = wait_for(lambda: read_json(group.result), timeout_s=60, what="the result")
        except WaitTimeout:
            result = None
    return GroupRun(codes, logs, result)


# -- the step ----------------------------------------------------------------------------------


def run(context: SmokeContext) -> list[Check]:
    node = context.node.node
    folder = context.folder / "2-nccl" / f"node-{node}"
    folder.mkdir(parents=True, exist_ok=True)
    gpus, _ = torch_gpus()
    address = node_address(context.config.bootstrap.node_address)
    environment = {**build_backend(context.config).environment(address), "NCCL_DEBUG": "INFO"}
    return [
        one_node(context, gpus, folder, environment),
        across_nodes(context, gpus, address, folder, environment),
        gloo(context, address, folder, environment),
    ]


def one_node(context: SmokeContext, gpus: int, folder: Path, environment: dict[str, str]) -> Check:
    name = "NCCL on this node"
    if gpus == 0:
        return failed(name, no_gpu("the NCCL all-reduce"))
    group = Group(
        "one-node", "nccl", 0, gpus, gpus, f"127.0.0.1:{context.ports().ray_gcs}", NCCL_BYTES,
        folder / "one-node.json",
    )  # fmt: skip
    return judged(name, run_group(context.python, group, folder, environment), "any")


def across_nodes(
    context: SmokeContext, gpus: int, address: str, folder: Path, environment: dict[str, str]
) -> Check:
    name = "NCCL across nodes"
    if context.num_nodes < 2:
        return failed(
            name,
            "not checked: this run has 1 node; run the kit as a Slurm job of 2 nodes or more "
            "(deepdive smoke EXPERIMENT --nodes 2)",
        )
    node = context.node
    context.publish(f"nccl-across.node-{node.node}", {"gpus": gpus, "address": address})
    if node.is_head:
        context.publish("nccl-across.master", {"master": f"{address}:{context.ports().ray_gcs}"})
    notes = context.await_nodes("nccl-across", "the GPU count", NOTE_TIMEOUT_S)
    counts = [int(note["gpus"]) for note in notes]
    if 0 in counts:
        without = ", ".join(str(index) for index, count in enumerate(counts) if count == 0)
        return failed(name, f"not run: no GPU on node(s) {without}")
    master = context.await_note("nccl-across.master", "node 0's store", NOTE_TIMEOUT_S)
    group = Group(
        "across", "nccl", sum(counts[: node.node]), gpus, sum(counts), str(master["master"]),
        NCCL_BYTES, context.folder / "2-nccl" / "node-0" / "across.json",
    )  # fmt: skip
    return judged(name, run_group(context.python, group, folder, environment), "network")


def gloo(context: SmokeContext, address: str, folder: Path, environment: dict[str, str]) -> Check:
    one_host = context.config.bootstrap.node_address != ROUTE
    interface, problem = chosen_interface(environment, address, one_host)
    name = f"gloo over {interface or 'the chosen interface'}"
    if problem is not None:
        return failed(name, problem)
    node = context.node
    if node.is_head:
        context.publish("gloo.master", {"master": f"{address}:{context.ports().ray_gcs}"})
    master = context.await_note("gloo.master", "node 0's gloo store", NOTE_TIMEOUT_S)
    group = Group(
        "gloo", "gloo", node.node * GLOO_RANKS_PER_NODE, GLOO_RANKS_PER_NODE,
        context.num_nodes * GLOO_RANKS_PER_NODE, str(master["master"]), GLOO_BYTES,
        context.folder / "2-nccl" / "node-0" / "gloo.json",
    )  # fmt: skip
    environment = {**environment, "GLOO_SOCKET_IFNAME": interface}
    return judged(name, run_group(context.python, group, folder, environment), None)


def judged(name: str, outcome: GroupRun, transport: str | None) -> Check:
    """The group's verdict: every rank exited 0, the sum was right, and NCCL's log shows a
    transport ("any") or a network one between nodes ("network")."""
    problem = outcome.failure()
    if problem is not None:
        return failed(name, problem)
    assert outcome.result is not None
    detail = f"{measured(outcome.result)}, result correct"
    if transport is None:
        return passed(name, detail)
    log = outcome.log_text()
    seen = transports(log)
    facts = nccl_facts(log)
    detail += f"; {facts}" if facts else ""
    if int(outcome.result["world"]) == 1:
        return passed(name, f"{detail}; one GPU: a single rank, no transport to see")
    if not seen:
        return failed(
            name,
            f"{detail}; but NCCL's log shows no transport (no 'Channel ... via' line with "
            "NCCL_DEBUG=INFO): what carried the data is unknown",
        )
    if transport == "network" and not network_transports(seen):
        return failed(
            name,
            f"{detail}; but no network transport between the nodes in NCCL's log "
            f"({describe_transports(seen)})",
        )
    return passed(name, f"{detail}; transport {describe_transports(seen)}")
