"""A node's way out through a real site proxy (tinyproxy, tests/site_proxy.py), to upstreams
on HTTPS whose certificate a CA of the test's own signed, trusted as a site's CA is trusted
(SSL_CERT_FILE): the tool server's outside client tunnels through the proxy with CONNECT,
with the proxy's Basic credentials from HTTPS_PROXY, and never writes them down."""

from __future__ import annotations

import re
import ssl
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
from tests.site_proxy import (
    Authority,
    make_authority,
    missing_proxy,
    tinyproxy,
)
from tests.slurm.test_egress_probe import probe

USER, PASSWORD = "agent", "pr0xy-pa55word-never-shown"

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
