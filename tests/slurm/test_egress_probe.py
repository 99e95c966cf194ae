"""The egress probe (slurm/node/egress.py): one real search and one real read through a node's own
tool server, started as the node starts it (`python -m services tools`, a child with the
node's environment), its upstreams fakes on loopback: an answer passes; a refused key, a
proxy that is gone or refuses, a name that does not resolve and a node with no route out
each fail naming the upstream and the kind, and never a secret."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from fakes.forward_proxy import ForwardProxy
from services.tool_server.config import ToolServerConfig
from slurm.node.egress import (
    FALLBACK_URL,
    PROBE_QUERY,
    EgressFailed,
    Upstreams,
)
from slurm.node.phases import NodeFailed, read_phases
from slurm.run_folder import read_json
from tests.helpers import (
    RESULT_URL,
    SERPER_BODY,
    SERPER_KEY,
    answer_search_and_read,
    clean_environment,
    internet_tools,
)
from tests.node_egress import node_bootstrap, probe, services_phase

ROOT = Path(__file__).resolve().parents[2]
PROXY_PASSWORD = "pr0xy-pa55word-never-shown"


@pytest.fixture
def upstream(httpserver: HTTPServer) -> str:
    return httpserver.url_for("").rstrip("/")


@pytest.fixture
def refusing_proxy() -> Iterator[ForwardProxy]:
    """A site's proxy that wants credentials the node does not have (407, HTTP or CONNECT)."""
    with serving(ForwardProxy({}, auth=("agent", "the-right-password"))) as proxy:
        yield proxy


@contextmanager
def serving(proxy: ForwardProxy) -> Iterator[ForwardProxy]:
    """`proxy` listening on loopback from a loop of its own, for the test's duration."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
    try:
        yield proxy
    finally:
        asyncio.run_coroutine_threadsafe(proxy.aclose(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_the_offline_world_is_what_the_tool_server_runs_by_default() -> None:
    defaults = ToolServerConfig()
    assert Upstreams.of({}) == Upstreams(defaults.search, defaults.reader)
    assert Upstreams.of({}).offline and not Upstreams.of({"reader": "jina"}).offline


def test_a_search_and_a_read_that_answer_pass(
    tmp_path: Path, httpserver: HTTPServer, upstream: str
) -> None:
    answer_search_and_read(httpserver)
    result = probe(tmp_path, internet_tools(upstream, upstream), clean_environment())
    assert (result.search, result.reader, result.read, result.note) == (
        "serper",
        "jina",
        "result 1",
        None,
    )
    # one search and one read, no more: what the probe costs
    assert [request.path for request, _ in httpserver.log] == ["/search", f"/{RESULT_URL}"]
    assert httpserver.log[0][0].headers["X-API-KEY"] == SERPER_KEY


def test_a_search_without_results_reads_the_fallback_and_an_unshown_page_still_passes(
    tmp_path: Path, httpserver: HTTPServer, upstream: str
) -> None:
    """No result to click: the probe opens FALLBACK_URL; Jina fetched it but it has no text
    (page_unavailable): the way out is proven, the note says what the page was."""
    httpserver.expect_request("/search", method="POST").respond_with_json(
        {"searchParameters": {"q": PROBE_QUERY}, "organic": []}
    )
    empty = {"code": 200, "data": {"title": "", "url": FALLBACK_URL, "content": ""}}
    httpserver.expect_request(f"/{FALLBACK_URL}").respond_with_data(
        json.dumps(empty), content_type="application/json"
    )
    result = probe(tmp_path, internet_tools(upstream, upstream), clean_environment())
    assert result.read == FALLBACK_URL
    assert result.note == "the page was fetched but not shown: jina: the page has no readable text"
    assert [request.path for request, _ in httpserver.log] == ["/search", f"/{FALLBACK_URL}"]


def test_a_key_serper_refuses_fails_naming_serper_and_401(
    tmp_path: Path, httpserver: HTTPServer, upstream: str
) -> None:
    httpserver.expect_request("/search", method="POST").respond_with_json(
        {"message": f"Unauthorized: {SERPER_KEY}", "statusCode": 401}, status=401
    )
    with pytest.raises(EgressFailed) as failure:
        probe(tmp_path, internet_tools(upstream, upstream), clean_environment())
    message = failure.value.message
    assert "search through serper failed" in message
    assert "serper: HTTP 401: key missing, invalid or not allowed; check SERPER_API_KEY" in message
    assert "no proxy set" in message and SERPER_KEY not in message


def test_a_proxy_that_is_gone_fails_naming_the_proxy(tmp_path: Path) -> None:
    gone = "http://127.0.0.1:9"  # nothing listens on the discard port
    environment = clean_environment(gone)
    table = internet_tools("https://serper.invalid", "https://jina.invalid")
    with pytest.raises(EgressFailed) as failure:
        probe(tmp_path, table, environment)
    message = failure.value.message
    assert "serper: could not connect to the proxy (HTTPS_PROXY): connection refused" in message
    assert f"through the proxy {gone} (HTTPS_PROXY)" in message


@pytest.mark.parametrize("scheme", ["https", "http"])  # CONNECT refused; a plain request refused
def test_a_proxy_that_refuses_fails_naming_the_proxy_and_never_its_password(
    tmp_path: Path, refusing_proxy: ForwardProxy, scheme: str
) -> None:
    url = refusing_proxy.url.replace("http://", f"http://agent:{PROXY_PASSWORD}@")
    environment = clean_environment(url)
    table = internet_tools(f"{scheme}://serper.invalid", f"{scheme}://jina.invalid")
    with pytest.raises(EgressFailed) as failure:
        probe(tmp_path, table, environment)
    message = failure.value.message
    refusal = {
        "https": "serper: the proxy refused the request (HTTP 407, HTTPS_PROXY)",
        "http": "serper: HTTP 407: the proxy refused the request, it wants credentials",
    }[scheme]
    assert refusal in message
    assert f"through the proxy {refusing_proxy.url} (HTTPS_PROXY)" in message
    assert PROXY_PASSWORD not in message and "agent" not in message
    assert refusing_proxy.seen == []  # refused before it forwarded anything


def test_a_name_that_does_not_resolve_fails_naming_dns(tmp_path: Path) -> None:
    table = internet_tools("https://google.serper.invalid", "https://r.jina.invalid")
    with pytest.raises(EgressFailed) as failure:
        probe(tmp_path, table, clean_environment())
    assert (
        "serper: could not resolve the host name google.serper.invalid (DNS)"
        in failure.value.message
    )


def test_a_read_that_fails_fails_naming_the_reader(
    tmp_path: Path, httpserver: HTTPServer, upstream: str
) -> None:
    """The search answers, the reader is a closed port: the read names jina."""
    httpserver.expect_request("/search", method="POST").respond_with_json(SERPER_BODY)
    table = internet_tools(upstream, "http://127.0.0.1:9")
    with pytest.raises(EgressFailed) as failure:
        probe(tmp_path, table, clean_environment())
    assert "the egress probe's read through jina failed" in failure.value.message
    assert "jina: could not connect: connection refused" in failure.value.message


def test_an_upstream_that_never_answers_fails_naming_the_timeout(tmp_path: Path) -> None:
    """A socket that listens but is never read: the connect succeeds, the reply never comes."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        table = internet_tools(url, url)
        table["serper"]["read_timeout_s"] = 1
        with pytest.raises(EgressFailed) as failure:
            probe(tmp_path, table, clean_environment())
    assert "serper: timed out after 1 attempts" in failure.value.message


def test_a_certificate_the_node_does_not_trust_fails_naming_tls(tmp_path: Path) -> None:
    """A fake Serper on HTTPS with a self-signed certificate (what a TLS-inspecting middlebox
    without the site's CA in the image looks like)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs openssl to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(  # fixed arguments
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        capture_output=True, check=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = HTTPServer("127.0.0.1", 0, ssl_context=context)
    server.expect_request("/search", method="POST").respond_with_json(SERPER_BODY)
    server.start()
    try:
        url = server.url_for("").rstrip("/")
        with pytest.raises(EgressFailed) as failure:
            probe(tmp_path, internet_tools(url, url), clean_environment())
    finally:
        server.stop()
    assert "serper: could not connect (the TLS certificate was refused)" in failure.value.message
    assert server.log == []  # no request got past the handshake


NO_ROUTE_SCRIPT = """
import sys
from pathlib import Path
from tests.helpers import clean_environment
from tests.node_egress import probe
from slurm.node.egress import EgressFailed
table = {"search": "serper", "reader": "jina", "serper": {"retry": {"max_attempts": 1}},
         "jina": {"retry": {"max_attempts": 1}}}  # the real upstreams' addresses
try:
    probe(Path(sys.argv[1]), table, clean_environment())
except EgressFailed as failure:
    print(failure.message)
    sys.exit(3)
"""


def test_a_node_with_no_route_out_fails_naming_dns_or_connect(tmp_path: Path) -> None:
    """In a network namespace with only loopback (`unshare -rn`: no route, no name server,
    no proxy), the real Serper cannot be reached: the probe says why."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2)")
    allowed = subprocess.run(
        [unshare, "-rn", ip, "link", "set", "lo", "up"], capture_output=True, check=False
    )
    if allowed.returncode != 0:
        pytest.skip(f"user and network namespaces are not permitted here: {allowed.stderr!r}")
    command = f'{ip} link set lo up && exec "$0" -c "$1" "$2"'
    done = subprocess.run(
        [unshare, "-rn", "sh", "-c", command, sys.executable, NO_ROUTE_SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "the egress probe's search through serper failed (no proxy set)" in done.stdout
    assert (
        "could not resolve the host name google.serper.dev (DNS)" in done.stdout
        or "could not connect: network unreachable" in done.stdout
    ), done.stdout


# -- through the bootstrap's services phase ---------------------------------------------------


def refusing_serper(httpserver: HTTPServer) -> str:
    httpserver.expect_request("/search", method="POST").respond_with_json({}, status=401)
    url = httpserver.url_for("").rstrip("/")
    retry = "retry={max_attempts=1}"
    return (
        f'{{search="serper", reader="jina", serper={{base_url="{url}", {retry}}}, '
        f'jina={{base_url="{url}", {retry}}}}}'
    )


def test_a_key_serper_refuses_fails_the_nodes_services_phase(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    bootstrap = node_bootstrap(tmp_path, "424251", refusing_serper(httpserver))
    with pytest.raises(NodeFailed) as failure:
        services_phase(bootstrap)
    assert bootstrap._failed(failure.value) == 1  # the note `deepdive status` reads
    note = read_json(bootstrap.attempt.failed(0))
    assert isinstance(note, dict)
    assert (note["node"], note["phase"]) == (0, "services")
    assert "the egress probe's search through serper failed" in note["error"]
    assert "serper: HTTP 401" in note["error"] and SERPER_KEY not in note["error"]
    failed = [
        line for line in read_phases(bootstrap.attempt.phases(0)) if line["event"] == "failed"
    ]
    assert [line["phase"] for line in failed] == ["services"]


def test_the_probe_can_be_turned_off(tmp_path: Path, httpserver: HTTPServer) -> None:
    bootstrap = node_bootstrap(
        tmp_path, "424252", refusing_serper(httpserver), "services.egress_probe=false"
    )
    probes = services_phase(bootstrap)
    assert [(line["event"], line["reason"]) for line in probes] == [
        ("off", "services.egress_probe = false")
    ]
    assert httpserver.log == []  # nothing was asked of the upstream


def test_the_offline_world_is_not_probed(tmp_path: Path, corpus_file: Path) -> None:
    tools = f'{{search="offline", reader="offline", corpus="{corpus_file}", index_cache=false}}'
    probes = services_phase(node_bootstrap(tmp_path, "424253", tools))
    assert [line["event"] for line in probes] == ["skipped"]
    assert "the offline world" in probes[0]["reason"]


@pytest.fixture
def routing_proxy(httpserver: HTTPServer) -> Iterator[ForwardProxy]:
    """A site's proxy, the only way to `serper.invalid` (the test's upstream on loopback)."""
    with serving(ForwardProxy({"serper.invalid": ("127.0.0.1", httpserver.port)})) as proxy:
        yield proxy


def behind_the_proxy(httpserver: HTTPServer) -> str:
    """Serper and Jina as `serper.invalid`, a name only the proxy resolves: a request that
    arrives came through it."""
    answer_search_and_read(httpserver)
    port = httpserver.port
    base = f"http://serper.invalid:{port}"
    retry = "retry={max_attempts=1}"
    return (
        f'{{search="serper", reader="jina", serper={{base_url="{base}", {retry}}}, '
        f'jina={{base_url="{base}", {retry}}}}}'
    )


def test_the_services_proxy_key_carries_the_nodes_searches(
    tmp_path: Path, httpserver: HTTPServer, routing_proxy: ForwardProxy
) -> None:
    """services.proxy reaches the services (the probe's search and read go through it) with
    nothing of the host's own proxy settings."""
    tools = behind_the_proxy(httpserver)
    proxy = f'services.proxy="{routing_proxy.url}"'
    probes = services_phase(node_bootstrap(tmp_path, "424254", tools, proxy))
    assert [line["event"] for line in probes] == ["passed"], probes
    port = httpserver.port
    assert routing_proxy.seen == [f"serper.invalid:{port}", f"serper.invalid:{port}"]


def test_a_services_proxy_that_is_gone_fails_the_node_naming_it(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{closed.getsockname()[1]}"
    bootstrap = node_bootstrap(
        tmp_path, "424255", behind_the_proxy(httpserver), f'services.proxy="{gone}"'
    )
    with pytest.raises(NodeFailed) as failure:
        services_phase(bootstrap)
    assert f"through the proxy {gone} (HTTPS_PROXY)" in str(failure.value)
    assert "could not connect to the proxy" in str(failure.value)
    assert httpserver.log == []
