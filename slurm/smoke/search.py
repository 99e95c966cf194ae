"""Step 1's real search: one search and one read from this node, through a tool server of the
experiment's own `[services.tools]` with the env file's keys and services.proxy, as a training
node's services phase makes them (the egress probe, slurm/node/egress.py).

A key the provider refuses, a proxy that is gone, a node with no route out then fail the kit,
naming the upstream and why, before a training job waits in the queue to fail the same way at
its start. The offline world (the default table) and services.egress_probe = false skip it:
nothing leaves the cluster, or the experiment asked for no probe. The cost: one search and one
read per node, as at every training job's start.
"""

from __future__ import annotations

import os
from pathlib import Path

from services.base.errors import DeepDiveError
from services.base.logs import redact
from services.base.process import ServiceProcess
from services.base.secrets import TOKEN_ENV, load_secrets
from slurm.backends import ServiceSpec
from slurm.config import ServicesTable
from slurm.node.egress import ProbeResult, Upstreams, probe_egress, proxy_route
from slurm.smoke.context import SmokeContext
from slurm.smoke.report import Check, failed, passed, skipped

NAME = "search"
OFFLINE = "the offline world ([services.tools] searches its own corpus): nothing leaves the cluster"


def search_check(context: SmokeContext) -> Check:
    """The experiment's upstreams reached from this node, or why not (never a key)."""
    services = context.config.services
    upstreams = Upstreams.of(services.tools)
    if upstreams.offline:
        return skipped(NAME, OFFLINE)
    if not services.egress_probe:
        return skipped(NAME, "services.egress_probe = false")
    folder = context.folder / "1-image" / f"node-{context.node.node}"
    try:
        environment = tool_environment(services)
        port = context.ports().service_ports("tools", 1)[0]
        session = f"smoke-search-{context.node.job_id}-node-{context.node.node}"
        result = probe_through(services, folder, port, environment, session)
    except DeepDiveError as error:  # EgressFailed, a tool server that did not start, the file
        return failed(NAME, redact(error.message))
    route = proxy_route({**os.environ, **environment})
    note = f"; {result.note}" if result.note else ""
    return passed(
        NAME,
        f"{result.search} and {result.reader} answered this node in {result.seconds:.2f} s "
        f"(read {result.read}, {route}){note}",
    )


def tool_environment(services: ServicesTable) -> dict[str, str]:
    """What the tool server gets on top of this process's environment, as on a training node:
    the env file's values (registered for redaction) and services.proxy's variables."""
    values = load_secrets(services.env_file)
    return {**values, **services.proxy_environment({**os.environ, **values})}


def probe_through(
    services: ServicesTable, folder: Path, port: int, environment: dict[str, str], session: str
) -> ProbeResult:
    """A tool server of one worker on loopback at `port`, probed, then stopped."""
    spec = ServiceSpec("tools", "tools", dict(services.tools), 1, services.log_level)
    arguments = [*spec.command_arguments(1, spec.write_config(folder)), "--host", "127.0.0.1"]
    process = ServiceProcess(
        spec.name,
        arguments,
        folder / f"{spec.name}.log",
        ready_timeout_s=services.ready_timeout_s,
        environment=environment,
        port=port,
    )
    seen = {**os.environ, **environment}
    with process:
        return probe_egress(
            process.urls[0],
            Upstreams.of(services.tools),
            session=session,
            timeout_s=services.ready_timeout_s,
            token=seen.get(TOKEN_ENV),
            environment=seen,
        )
