"""A node's way out through a real site proxy (tinyproxy, tests/site_proxy.py), to upstreams
on HTTPS whose certificate a CA of the test's own signed, trusted as a site's CA is trusted
(SSL_CERT_FILE): the tool server's outside client tunnels through the proxy with CONNECT,
with the proxy's Basic credentials from HTTPS_PROXY, and never writes them down. Then a node
with no route out at all (`unshare -rn`: only its own loopback), whose one way out is that
proxy bridged in: the node's services phase searches and reads through it; without the proxy
the fake upstreams cannot be reached; with the proxy stopped the phase fails naming it."""

from __future__ import annotations

import json
import re
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from slurm.node.egress import EgressFailed
from tests.helpers import (
    RESULT_URL,
    SERPER_KEY,
    answer_search_and_read,
    clean_environment,
    internet_tools,
)
from tests.node_egress import probe
from tests.site_proxy import (
    Authority,
    bridge,
    in_namespace,
    make_authority,
    missing_namespace,
    missing_proxy,
    tinyproxy,
)

ROOT = Path(__file__).resolve().parents[2]
USER, PASSWORD = "agent", "pr0xy-pa55word-never-shown"
INSIDE_PORT = 3128  # the proxy's port inside the namespace (squid's): nothing else is there

pytestmark = pytest.mark.skipif(missing_proxy() is not None, reason=str(missing_proxy()))


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return make_authority(tmp_path / "ca")


@pytest.fixture
def tls_upstream(authority: Authority) -> Iterator[HTTPServer]:
    """Serper and Jina on https://localhost:PORT (the host's loopback), one result and its
    page, with the certificate the test's CA signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(authority.cert, authority.key)
    server = HTTPServer("127.0.0.1", 0, ssl_context=context)
    answer_search_and_read(server)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        server.stop()


def tls_tools(server: HTTPServer) -> dict[str, object]:
    base = f"https://localhost:{server.port}"
    return internet_tools(base, base)


def everything_written(folder: Path) -> str:
    """Every file the tool server and the node wrote under `folder` (logs, notes, configs)."""
    return "\n".join(
        path.read_text(errors="replace") for path in sorted(folder.rglob("*")) if path.is_file()
    )


def test_a_search_and_a_read_tunnel_through_the_site_proxy_with_its_credentials(
    tmp_path: Path, authority: Authority, tls_upstream: HTTPServer
) -> None:
    """Serper and Jina over HTTPS, through tinyproxy with CONNECT and Basic credentials: the
    proxy took one CONNECT per call to the upstream's port (the only one it allows), each
    reached the fake, and the password is in no log the node writes."""
    port = tls_upstream.port
    with tinyproxy(tmp_path / "proxy", auth=(USER, PASSWORD), connect_ports=[port]) as proxy:
        environment = {
            **clean_environment(proxy.url_with_credentials()),
            "SSL_CERT_FILE": str(authority.ca),
        }
        result = probe(tmp_path / "node", tls_tools(tls_upstream), environment)
    assert (result.search, result.reader, result.read, result.note) == (
        "serper",
        "jina",
        "result 1",
        None,
    )
    assert proxy.requests() == [("CONNECT", f"localhost:{port}")] * 2, proxy.log()
    assert proxy.log().count('Established connection to host "localhost"') == 2
    assert [request.path for request, _ in tls_upstream.log] == ["/search", f"/{RESULT_URL}"]
    assert tls_upstream.log[0][0].headers["X-API-KEY"] == SERPER_KEY  # inside the tunnel
    written = everything_written(tmp_path / "node")
    assert "tool server (search=serper, reader=jina) listening" in written  # its log is there
    assert PASSWORD not in written and PASSWORD not in proxy.log()


def test_wrong_proxy_credentials_are_refused_by_the_proxy_and_never_shown(
    tmp_path: Path, authority: Authority, tls_upstream: HTTPServer
) -> None:
    with tinyproxy(tmp_path / "proxy", auth=(USER, "the-right-one")) as proxy:
        wrong = proxy.url.replace("http://", f"http://{USER}:{PASSWORD}@")
        environment = {**clean_environment(wrong), "SSL_CERT_FILE": str(authority.ca)}
        with pytest.raises(EgressFailed) as failure:
            probe(tmp_path / "node", tls_tools(tls_upstream), environment)
    message = failure.value.message
    # tinyproxy 1.11 answers a CONNECT without the right credentials with 401, not 407
    assert re.search(r"serper: the proxy refused the request \(HTTP 40[17], HTTPS_PROXY\)", message)
    assert f"through the proxy {proxy.url} (HTTPS_PROXY)" in message
    assert PASSWORD not in message + everything_written(tmp_path / "node")
    assert "Established connection" not in proxy.log() and tls_upstream.log == []


def test_a_tunnel_to_a_certificate_the_node_does_not_trust_fails_naming_tls(
    tmp_path: Path, tls_upstream: HTTPServer
) -> None:
    """The same tunnel without SSL_CERT_FILE: the proxy carried the CONNECT, the node refused
    the certificate at the far end (a site CA missing from the image)."""
    with tinyproxy(tmp_path / "proxy") as proxy, pytest.raises(EgressFailed) as failure:
        probe(tmp_path / "node", tls_tools(tls_upstream), clean_environment(proxy.url))
    assert "serper: could not connect (the TLS certificate was refused)" in failure.value.message
    assert proxy.requests() == [("CONNECT", f"localhost:{tls_upstream.port}")]
    assert tls_upstream.log == []  # no request got past the handshake


# -- a node with no route out -----------------------------------------------------------------

INSIDE = """
import json, os, sys
from pathlib import Path
from slurm.node.egress import EgressFailed
from slurm.node.phases import NodeFailed
from tests.helpers import clean_environment, internet_tools
from tests.node_egress import node_bootstrap, probe, services_phase

folder, upstream, job = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
base = f"https://localhost:{upstream}"  # the fakes, on the host's loopback: not this one's
retry = "retry={max_attempts=1}"
tools = (f'{{search="serper", reader="jina", serper={{base_url="{base}", {retry}}}, '
         f'jina={{base_url="{base}", {retry}}}}}')
site = clean_environment(os.environ["SITE_PROXY"])  # what the env file's HTTPS_PROXY gives
for scenario in sys.argv[4:]:
    try:
        if scenario == "direct":  # no proxy set
            result = probe(folder / scenario, internet_tools(base, base), clean_environment())
            result = result.detail()
        elif scenario == "probe":  # the probe alone, through the site's proxy
            result = probe(folder / scenario, internet_tools(base, base), site).detail()
        else:  # the node's services phase, as the bootstrap runs it
            result = services_phase(node_bootstrap(folder / scenario, job, tools), site)
        print(json.dumps({"scenario": scenario, "passed": result}), flush=True)
    except (EgressFailed, NodeFailed) as failure:
        print(json.dumps({"scenario": scenario, "failed": str(failure)}), flush=True)
"""


def inside_the_namespace(
    socket_path: Path, folder: Path, upstream_port: int, job: str, *scenarios: str, ca: Path
) -> dict[str, dict[str, object]]:
    """Each scenario's outcome, run in one namespace without a route out (INSIDE), the site's
    proxy at 127.0.0.1:INSIDE_PORT there with the test's credentials, SSL_CERT_FILE the
    test's CA (both in the node's environment, as a site sets them)."""
    proxy = f"http://{USER}:{PASSWORD}@127.0.0.1:{INSIDE_PORT}"
    done = in_namespace(
        sys.executable,
        socket_path,
        INSIDE_PORT,
        INSIDE,
        str(folder),
        str(upstream_port),
        job,
        *scenarios,
        cwd=ROOT,
        environment={"SSL_CERT_FILE": str(ca), "SITE_PROXY": proxy, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {line.pop("scenario"): line for line in lines}


@pytest.mark.slow
@pytest.mark.skipif(missing_namespace() is not None, reason=str(missing_namespace()))
def test_a_node_with_no_route_out_reaches_its_upstreams_only_through_the_site_proxy(
    tmp_path: Path, authority: Authority, tls_upstream: HTTPServer
) -> None:
    port = tls_upstream.port
    with (
        tinyproxy(tmp_path / "proxy", auth=(USER, PASSWORD), connect_ports=[port]) as proxy,
        bridge(proxy.port) as socket_path,
    ):
        seen = inside_the_namespace(
            socket_path,
            tmp_path / "node",
            port,
            "424261",
            "direct",
            "probe",
            "services",
            ca=authority.ca,
        )
        proxy.stop()
        gone = inside_the_namespace(
            socket_path, tmp_path / "node" / "gone", port, "424262", "services", ca=authority.ca
        )
    inside = f"http://127.0.0.1:{INSIDE_PORT}"
    # direct, the fakes cannot be reached: the namespace's loopback is its own
    direct = str(seen["direct"].get("failed"))
    assert "the egress probe's search through serper failed (no proxy set)" in direct, seen
    assert "serper: could not connect: connection refused" in direct
    # through the proxy, the probe alone and in the services phase: a search and a read each
    probed = seen["probe"].get("passed")
    assert isinstance(probed, dict), seen
    assert (probed["search"], probed["reader"], probed["read"]) == ("serper", "jina", "result 1")
    services = seen["services"].get("passed")
    assert isinstance(services, list), seen
    assert [(line["event"], line["read"]) for line in services] == [("passed", "result 1")]
    assert proxy.requests() == [("CONNECT", f"localhost:{port}")] * 4, proxy.log()
    assert [request.path for request, _ in tls_upstream.log] == [
        "/search",
        f"/{RESULT_URL}",
    ] * 2
    # the proxy stopped: the node's services phase fails, naming it
    failed = str(gone["services"].get("failed"))
    assert failed.startswith("node 0 failed during services: "), gone
    assert f"search through serper failed (through the proxy {inside} (HTTPS_PROXY))" in failed
    # the bridge took the connection and closed it, as a port forward to a proxy that is gone
    assert "serper: the proxy or the server beyond it closed the connection" in failed
    assert len(tls_upstream.log) == 4  # nothing more reached the upstream
    assert PASSWORD not in json.dumps([seen, gone]) + everything_written(tmp_path / "node")
