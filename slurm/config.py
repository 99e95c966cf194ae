"""The experiment file of `deepdive submit` (configs/cluster-local.toml), as typed dataclasses.

One TOML file says where the run lives, what Slurm is asked for, which image runs it, how each
node's services and bootstrap behave, and what the backend trains. It is checked whole before
anything is submitted (an unknown key, a wrong type names the key and what it expects; what
must exist on disk is slurm.launch.preflight's) and saved resolved in the run folder, so a requeued or resubmitted job
runs exactly what was submitted. Secrets are never part of it: `services.env_file` names a
file (mode 0600) that each node reads for itself.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from deepdive.local.config import LocalRunConfig, RunSection
from services.base.errors import ConfigError
from services.base.typed_config import load_toml, require
from services.commands import service_config
from slurm.backends.slime.config import SlimeSection
from slurm.node.network import ROUTE
from slurm.node.ports import TOOL_PORTS
from slurm.run_folder import RunFolder

Backend = Literal["local", "slime"]


@dataclass(frozen=True)
class RunTable:
    """folder: the run folder on storage every node sees (checkpoints, logs, metrics, the
    resolved config, the submitit folder); relative paths are taken from where you submit."""

    name: str = "deepdive"
    folder: str = ""
    backend: Backend = "local"

    def __post_init__(self) -> None:
        require(bool(self.folder), "run.folder", "a folder on shared storage", self.folder)
        require(
            bool(self.name) and all(ch.isalnum() or ch in "-_." for ch in self.name),
            "run.name",
            "letters, digits, '-', '_' or '.'",
            self.name,
        )


@dataclass(frozen=True)
class SlurmTable:
    """What sbatch is asked for. One task per node; `extra` takes any other sbatch option
    ({"mail-type" = "END"}); `setup` lines run in the batch script before srun."""

    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: int = 0  # 0 = the cluster's default
    mem_gb: float = 0.0  # per node; 0 = the whole node when exclusive, else the default
    time_min: int = 60
    partition: str = ""
    account: str = ""
    qos: str = ""
    constraint: str = ""
    exclusive: bool = False
    signal_delay_s: int = 90  # SIGURG this long before the time limit: requeue and resume
    # requeues a run survives, whatever their cause (a time limit or a preemption alike: the
    # job's SLURM_RESTART_COUNT); submitit's "timed-out"/"preempted" is its guess from elapsed time
    max_requeues: int = 3
    extra: dict[str, str] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        require(self.nodes >= 1, "slurm.nodes", "at least 1", self.nodes)
        for name in ("gpus_per_node", "cpus_per_task", "max_requeues", "signal_delay_s"):
            value = getattr(self, name)
            require(value >= 0, f"slurm.{name}", "0 or more", value)
        require(self.mem_gb >= 0, "slurm.mem_gb", "0 (default) or more", self.mem_gb)
        require(self.time_min >= 1, "slurm.time_min", "at least 1 minute", self.time_min)
        require(
            self.signal_delay_s < self.time_min * 60,
            "slurm.signal_delay_s",
            f"less than the time limit ({self.time_min * 60} s)",
            self.signal_delay_s,
        )
        reserved = {"output", "error", "signal", "nodes", "ntasks-per-node", "open-mode"}
        for key in self.extra:
            require(
                key.replace("_", "-") not in reserved,
                f"slurm.extra.{key}",
                "an option the launcher does not set itself",
                key,
            )


@dataclass(frozen=True)
class ContainerTable:
    """image: an Apptainer .sif every node can read; "" = no container, the job runs the
    Python that submitted it (a virtual environment on shared storage). That the image exists
    is checked where the job is submitted (slurm/launch/preflight.py), not when a config is loaded: the
    trainer reads the run's config inside the image, where the image's own path is rarely
    bound."""

    image: str = ""
    apptainer: str = "apptainer"
    nv: bool = True  # --nv: the host's NVIDIA driver inside the container
    binds: list[str] = field(default_factory=list)  # also bound: the run folder, /dev/shm
    options: list[str] = field(default_factory=list)  # e.g. ["--writable-tmpfs"]
    python: str = "python3"

    def __post_init__(self) -> None:
        for option in self.options:
            require(
                option.split("=", 1)[0] not in CLEAN_ENVIRONMENT,
                "container.options",
                "no --containall or --cleanenv: submitit's task needs the job's Slurm and "
                "SUBMITIT_* variables srun gives it, and they would not reach the image",
                option,
            )


# Apptainer's options that start the container without the host's environment
CLEAN_ENVIRONMENT = {"--containall", "-C", "--cleanenv", "-e"}


# services.host: the node's own cluster address (bootstrap.node_address), resolved on each node
NODE_ADDRESS = "node"

# [services.tools] / [services.reward]: a table of the service's own config file (its keys the
# fields of ToolServerConfig / RewardServerConfig, nested tables theirs), which the node writes
# into the attempt folder and hands the service (`python -m services tools --config FILE`)
ServiceTable = dict[str, Any]
# what the launcher gives every service itself, and where it comes from
SET_BY_THE_LAUNCHER = {
    "host": "services.host",
    "port": "the node's port plan",
    "workers": "services.tool_workers",
    "log_level": "services.log_level",
    "env_file": "services.env_file",
}
# keys that name a file the job reads: slurm.launch.preflight lists it when it is missing
INPUT_FILES = ("corpus",)
# keys that are paths: taken from where you submit, as the experiment's other paths
PATHS = ("corpus", "index_cache_dir")


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def check_proxy(proxy: str) -> None:
    """services.proxy: empty, or http(s)://HOST[:PORT] with no credentials, path or query (a
    password is named as refused, never shown)."""
    if not proxy:
        return
    parts = urlsplit(proxy)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            "services.proxy: the URL holds credentials; the experiment file is copied into the "
            "run folder, so put the whole URL in the env file as "
            "HTTPS_PROXY=http://USER:PASSWORD@HOST:PORT instead"
        )
    try:
        port = parts.port
    except ValueError:
        port = -1
    shape = (
        parts.scheme in ("http", "https")
        and bool(parts.hostname)
        and port != -1
        and parts.path in ("", "/")
        and not parts.query
        and not parts.fragment
    )
    require(shape, "services.proxy", "http://HOST:PORT (the site's HTTP proxy)", proxy)


def check_service_table(service: str, table: ServiceTable) -> None:
    """`[services.SERVICE]` read as the service reads its config file, the files it names
    left to slurm.launch.preflight: a ConfigError naming `services.SERVICE.KEY`."""
    where = f"services.{service}"
    for key, value in table.items():
        if key in SET_BY_THE_LAUNCHER:
            raise ConfigError(f"{where}.{key}: set by the launcher ({SET_BY_THE_LAUNCHER[key]})")
        if key in INPUT_FILES:  # whether it exists is slurm.launch.preflight's
            require(isinstance(value, str), f"{where}.{key}", "a path (a string)", value)
    service_config(service, {k: v for k, v in table.items() if k not in INPUT_FILES}, "", where)


@dataclass(frozen=True)
class ServicesTable:
    """Each node's tool and reward servers. host "node" (the default): each node's own cluster
    address (the one Ray uses), never every interface; any address but loopback needs
    DEEPDIVE_SERVICE_TOKEN (environment or env file); 127.0.0.1 when the services answer their
    own node's rollout worker only (the local backend). env_file: KEY=VALUE secrets
    (SERPER_API_KEY, ...), mode 0600, read on the node. tools, reward: each service's config
    ([services.tools], [services.reward]: ServiceTable), checked as the service reads its
    config file when the experiment loads.
    tool_workers: the tool server's worker processes on each node, each on its own port of the
    node's block; 0 = one per CPU of the node's task, at most 8 (services.serving.workers).
    egress_probe: a tool server on the internet makes one real search and one real read at
    each node's start, failing the node naming the upstream (slurm/node/egress.py); false: none.
    proxy: the site's HTTP proxy for the services' internet upstreams (search, reader, judge),
    "http://HOST:PORT": set as their HTTPS_PROXY / HTTP_PROXY (NO_PROXY keeps loopback and the
    environment's own entries); Ray, the trainer and in-cluster hops never see it. A proxy that
    wants credentials goes in the env file as HTTPS_PROXY=http://USER:PASSWORD@HOST:PORT: the
    experiment file is copied into the run folder, so it never holds a password."""

    host: str = NODE_ADDRESS
    env_file: str = ""
    ready_timeout_s: float = 120.0
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "WARNING"
    tool_workers: int = 0
    egress_probe: bool = True
    proxy: str = ""
    # the slime backend's servers, each a table of its config file (the local backend serves
    # its own world): e.g. [services.tools] search = "serper", reader = "jina"; an empty
    # table runs the service's defaults (offline search and reader, the rule judge)
    tools: ServiceTable = field(default_factory=dict)
    reward: ServiceTable = field(default_factory=dict)

    def __post_init__(self) -> None:
        require(self.ready_timeout_s > 0, "services.ready_timeout_s", "> 0", self.ready_timeout_s)
        require(
            0 <= self.tool_workers <= TOOL_PORTS,
            "services.tool_workers",
            f"0 (one per CPU of the task) to {TOOL_PORTS} (the ports a node keeps for them)",
            self.tool_workers,
        )
        check_proxy(self.proxy)
        check_service_table("tools", self.tools)
        check_service_table("reward", self.reward)

    def proxy_environment(self, environment: dict[str, str]) -> dict[str, str]:
        """What `proxy` adds to the services' environment (`environment`: theirs without it):
        nothing when unset; else the proxy for https:// and http:// and a NO_PROXY that keeps
        loopback direct beside whatever NO_PROXY already names."""
        if not self.proxy:
            return {}
        named = f"{environment.get('NO_PROXY', '')},{environment.get('no_proxy', '')}"
        direct = list(dict.fromkeys(item.strip() for item in named.split(",") if item.strip()))
        direct += [host for host in LOOPBACK_HOSTS if host not in direct]
        values = {"HTTPS_PROXY": self.proxy, "HTTP_PROXY": self.proxy, "NO_PROXY": ",".join(direct)}
        # both spellings: a lower-case one, even empty, wins over the upper-case one (urllib)
        return {**values, **{name.lower(): value for name, value in values.items()}}


@dataclass(frozen=True)
class BootstrapTable:
    """join_timeout_s: how long a node waits for the others (storage, Ray, services) before
    the job fails naming the one that is missing. node_address: the address each node's Ray
    (--node-ip-address), its services (host "node") and the URLs it publishes use: "route",
    the address the node's default route leaves from (every real cluster), or a loopback
    IPv4 address other than 127.0.0.1 (Ray replaces that one) for nodes emulated on one host
    (configs/cluster-tiny.toml: a test job is then reached on loopback only). Any other
    literal would be every node's address, so it is refused."""

    join_timeout_s: float = 300.0
    node_address: str = ROUTE
    # SIGTERM to SIGKILL for a node's children, all stopped at once: the whole teardown must fit
    # in Slurm's KillWait (30 s by default, 5 s on scripts/local-slurm.sh's cluster), and a
    # Ray driver told to stop (the trainer) can hang in its exit handlers
    stop_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        require(self.join_timeout_s > 0, "bootstrap.join_timeout_s", "> 0", self.join_timeout_s)
        require(self.stop_timeout_s > 0, "bootstrap.stop_timeout_s", "> 0", self.stop_timeout_s)
        require(
            self.node_address == ROUTE or _is_ipv4_loopback(self.node_address),
            "bootstrap.node_address",
            f'"{ROUTE}" (the default route\'s address) or a loopback IPv4 address such as '
            '"127.0.0.2" (nodes emulated on one host); one address for every node of a real '
            "cluster would be reachable on none",
            self.node_address,
        )
        require(
            self.node_address not in RAY_REWRITES,
            "bootstrap.node_address",
            "another loopback address than 127.0.0.1, such as 127.0.0.2: `ray start` replaces "
            "127.0.0.1 with the host's interface address (ray.scripts.scripts, "
            "resolve_ip_for_localhost), so Ray would be reached beyond loopback",
            self.node_address,
        )


# what `ray start --node-ip-address` takes for "this host" and replaces with its interface address
RAY_REWRITES = ("127.0.0.1",)


def _is_ipv4_loopback(address: str) -> bool:
    try:
        return ipaddress.IPv4Address(address).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ExperimentConfig:
    run: RunTable = field(default_factory=lambda: RunTable(folder="runs/deepdive"))
    slurm: SlurmTable = field(default_factory=SlurmTable)
    container: ContainerTable = field(default_factory=ContainerTable)
    services: ServicesTable = field(default_factory=ServicesTable)
    bootstrap: BootstrapTable = field(default_factory=BootstrapTable)
    local: LocalRunConfig = field(default_factory=LocalRunConfig)  # backend = "local"
    slime: SlimeSection = field(default_factory=SlimeSection)  # backend = "slime"

    def __post_init__(self) -> None:
        require(
            self.local.run.out == RunSection().out,
            "local.run.out",
            "left unset (on a cluster the run folder is run.folder)",
            self.local.run.out,
        )

    @property
    def run_folder(self) -> RunFolder:
        """The run folder's layout (slurm/run_folder.py), at run.folder."""
        return RunFolder(Path(self.run.folder))

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_experiment(path: Path, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """The file, the overrides, then every path made absolute (taken from where you submit)."""
    config = load_toml(path, ExperimentConfig, overrides)
    return resolved(config)


def resolved(config: ExperimentConfig) -> ExperimentConfig:
    """Paths absolute and the local backend's run folder set to the run folder."""
    folder = Path(config.run.folder).expanduser().absolute()
    run = dataclasses.replace(config.run, folder=str(folder))
    local = dataclasses.replace(
        config.local, run=dataclasses.replace(config.local.run, out=RunSection().out)
    )
    container = config.container
    if container.image:
        image = str(Path(container.image).expanduser().absolute())
        container = dataclasses.replace(container, image=image)
    slime = config.slime
    slime = dataclasses.replace(
        slime,
        model=dataclasses.replace(
            slime.model,
            hf_checkpoint=absolute(slime.model.hf_checkpoint),
            ref_load=absolute(slime.model.ref_load),
        ),
        rollout=dataclasses.replace(slime.rollout, prompt_data=absolute(slime.rollout.prompt_data)),
        eval=dataclasses.replace(
            slime.eval, sets={name: absolute(path) for name, path in slime.eval.sets.items()}
        ),
    )
    services = config.services
    if services.env_file:  # its existence and mode: slurm.launch.preflight
        env_file = Path(services.env_file).expanduser().absolute()
        services = dataclasses.replace(services, env_file=str(env_file))
    tools = {
        key: absolute(value) if key in PATHS and isinstance(value, str) else value
        for key, value in services.tools.items()
    }
    services = dataclasses.replace(services, tools=tools)
    return dataclasses.replace(
        config, run=run, local=local, container=container, services=services, slime=slime
    )


def absolute(path: str) -> str:
    """A path taken from where you submit ("" stays empty)."""
    return str(Path(path).expanduser().absolute()) if path else path


def local_run_config(config: ExperimentConfig) -> LocalRunConfig:
    """The local backend's config, writing into the run folder."""
    section = dataclasses.replace(config.local.run, out=config.run.folder)
    return dataclasses.replace(config.local, run=section)
