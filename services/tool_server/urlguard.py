"""The URL guard: the server never fetches an internal address for the model.

Applies to every fetch the server makes itself (the `direct` reader). A URL must be http(s) with
a host; its host must not be, or resolve to, a loopback, private, link-local, CGNAT, multicast,
reserved or cloud-metadata address, in any spelling (IPv6, IPv4-mapped IPv6, decimal, hex,
octal, short forms). The check runs after DNS resolution, and the request is then pinned to the
address that was checked (no second lookup an attacker could rebind), on every redirect hop.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import anyio
import httpx

from services.base.errors import URLRejected

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_BLOCKED_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "ip6-localhost",
        "ip6-loopback",
        "metadata",
        "metadata.google.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
_BLOCKED_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")
_INET_ATON_SPELLING = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}$", re.I)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def parse_ip_literal(host: str) -> IPAddress | None:
    """An IP address written in any form a resolver would accept, or None for a name."""
    host = host.strip().strip("[]").rstrip(".")
    if "%" in host:  # IPv6 zone index: fe80::1%eth0
        host = host.split("%", 1)[0]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _INET_ATON_SPELLING.match(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def is_public_address(ip: IPAddress) -> bool:
    """True only for globally routable unicast addresses (IPv4 inside IPv6 checked as IPv4)."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip.teredo is not None:
            embedded = ip.teredo[1]
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public_address(embedded)
    return ip.is_global and not ip.is_multicast and not ip.is_reserved


@dataclass(frozen=True)
class PinnedTarget:
    """A checked request target: send to `url` (host replaced by the checked IP) with these extras."""

    url: httpx.URL
    headers: dict[str, str]
    sni_hostname: str | None


class URLGuard:
    """Checks URLs and pins them to a checked address. `allowed_networks` are trusted exceptions."""

    def __init__(self, allowed_networks: Iterable[str] = ()) -> None:
        self.allowed: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(n, strict=False) for n in allowed_networks
        )

    def address_allowed(self, ip: IPAddress) -> bool:
        return any(ip in net for net in self.allowed) or is_public_address(ip)

    def check_syntax(self, url: str) -> httpx.URL:
        """Scheme, host and literal addresses; no DNS. Raises `URLRejected`."""
        try:
            parsed = httpx.URL(url.strip())
            host = parsed.host.rstrip(".").lower()  # httpx decodes IDNA here, lazily
        except (httpx.InvalidURL, TypeError, ValueError) as exc:  # IDNAError is a ValueError
            raise URLRejected(f"not a valid URL: {str(exc)[:200]}") from None
        if parsed.scheme not in ("http", "https"):
            raise URLRejected(
                f"only http and https URLs can be opened, not {parsed.scheme or 'a relative URL'}"
            )
        if not host:
            raise URLRejected("the URL has no host")
        if parsed.userinfo:
            raise URLRejected("URLs with a user name or password are not opened")
        literal = parse_ip_literal(host)
        if literal is not None:
            if not self.address_allowed(literal):
                raise URLRejected("the URL points to a private or reserved address")
        elif (host in _BLOCKED_NAMES or host.endswith(_BLOCKED_SUFFIXES)) and not self.allowed:
            # With trusted networks configured, such names are judged by what they resolve to.
            raise URLRejected("the URL points to a local or internal host name")
        return parsed

    async def pin(self, url: str) -> PinnedTarget:
        """Check, resolve, check every resolved address, and pin the request to the first one."""
        parsed = self.check_syntax(url)
        host = parsed.host.rstrip(".")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        literal = parse_ip_literal(host)
        if literal is not None:
            address = literal
        else:
            try:
                infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError:
                raise URLRejected(f"the host {host} could not be resolved") from None
            addresses = [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]
            if not addresses:
                raise URLRejected(f"the host {host} could not be resolved")
            if not all(self.address_allowed(a) for a in addresses):
                raise URLRejected(f"the host {host} resolves to a private or reserved address")
            address = addresses[0]
        host_header = host if parsed.port is None else f"{host}:{parsed.port}"
        return PinnedTarget(
            url=parsed.copy_with(host=str(address)),
            headers={"Host": host_header},
            sni_hostname=host if parsed.scheme == "https" and literal is None else None,
        )
