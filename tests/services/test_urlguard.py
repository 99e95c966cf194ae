import ipaddress

import pytest

from services.base.errors import URLRejected
from services.tool_server.urlguard import URLGuard, is_public_address, parse_ip_literal

BLOCKED = [
    "http://127.0.0.1/",
    "http://127.1/",
    "http://0177.0.0.1/",
    "http://0x7f000001/",
    "http://2130706433/",
    "http://0x7f.1/",
    "http://0/",
    "http://0.0.0.0/",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[0:0:0:0:0:ffff:a9fe:a9fe]/",
    "http://[2002:7f00:1::]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[fe80::1%25eth0]/",
    "http://[fd00:ec2::254]/",
    "http://10.0.0.1/",
    "http://172.16.5.4/",
    "http://192.168.1.1:8080/",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/",
    "http://224.0.0.1/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "http://localhost/",
    "http://LOCALHOST./",
    "http://foo.localhost/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://printer.local/",
    "file:///etc/passwd",
    "gopher://example.com/",
    "ftp://example.com/",
    "http://user:pass@example.com/",
    "//example.com/",
    "http:///nohost",
    # IDNA errors raised while httpx decodes the host (once an HTTP 500)
    "http://xn--/",
    "https://xn--ls8h.la/",
    "http://xn--127-0.0.0.1/",
    "http://xn--a.example/",
]


@pytest.mark.parametrize("url", BLOCKED)
def test_guard_refuses_internal_and_odd_urls(url: str) -> None:
    with pytest.raises(URLRejected):
        URLGuard().check_syntax(url)


@pytest.mark.parametrize(
    "url", ["https://example.com/a?b=1", "http://93.184.216.34/", "https://[2606:4700::1111]/"]
)
def test_guard_accepts_public_urls(url: str) -> None:
    assert URLGuard().check_syntax(url).scheme in ("http", "https")


def test_parse_ip_literal_understands_every_spelling() -> None:
    loopback = ipaddress.IPv4Address("127.0.0.1")
    for spelling in ("127.0.0.1", "127.1", "0x7f000001", "2130706433", "0177.0.0.01"):
        assert parse_ip_literal(spelling) == loopback, spelling
    assert parse_ip_literal("example.com") is None
    assert parse_ip_literal("1.2.3.4.5") is None


def test_is_public_address_checks_embedded_ipv4() -> None:
    assert is_public_address(ipaddress.ip_address("8.8.8.8"))
    assert is_public_address(ipaddress.ip_address("::ffff:8.8.8.8"))
    assert not is_public_address(ipaddress.ip_address("::ffff:10.0.0.1"))


def test_allowed_networks_are_trusted() -> None:
    guard = URLGuard(["127.0.0.0/8"])
    assert guard.check_syntax("http://127.0.0.1:9000/x").port == 9000
    with pytest.raises(URLRejected):
        guard.check_syntax("http://10.0.0.1/")


@pytest.mark.anyio
async def test_pin_resolves_names_and_refuses_private_answers() -> None:
    # "localhost" is refused by name; a numeric host is pinned as it is.
    with pytest.raises(URLRejected):
        await URLGuard().pin("http://localhost:8080/")
    target = await URLGuard().pin("https://93.184.216.34/page")
    assert target.url.host == "93.184.216.34"
    assert target.headers == {"Host": "93.184.216.34"}


@pytest.mark.anyio
async def test_pin_checks_the_resolved_address(tmp_path: object) -> None:
    # A name outside the blocked list that resolves to loopback (from /etc/hosts) is refused
    # after resolution; with loopback allowed it is pinned to the checked address with SNI.
    import socket

    name = socket.gethostname()
    address = socket.gethostbyname(name)
    if (
        not ipaddress.ip_address(address).is_private
        and not ipaddress.ip_address(address).is_loopback
    ):
        pytest.skip("this host name resolves to a public address")
    with pytest.raises(URLRejected, match="resolves to a private"):
        await URLGuard().pin(f"https://{name}/")
    target = await URLGuard(["0.0.0.0/0"]).pin(f"https://{name}:8443/x")
    assert target.url.host == address
    assert target.headers == {"Host": f"{name}:8443"}
    assert target.sni_hostname == name
