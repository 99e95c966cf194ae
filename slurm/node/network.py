"""A node's address and the network interface that carries it.

`node_address` is the address Ray (`--node-ip-address`), the services (`services.host =
"node"`) and the URLs other nodes are handed all use: with `bootstrap.node_address = "route"`
(the default) the one the node's default route leaves from, as Ray picks it itself; a loopback
address where it is set to one (configs/cluster-tiny.toml: nodes emulated on one host, so a
test job's Ray node and services are reached on loopback; Ray's gRPC servers still listen on
every address, which no setting of Ray 2.60 changes).

`interface_for` says which interface NCCL and gloo must use (NCCL_SOCKET_IFNAME,
GLOO_SOCKET_IFNAME). Left to choose, they may take an interface the other nodes cannot reach (a
docker bridge, a second NIC); given a loopback address, every other node would wait on a
connection that never comes. It is a pure function of the interface table;
`interface_addresses` reads the table from the kernel (SIOCGIFADDR per interface name: IPv4,
the interface's primary address; the node's address is IPv4). No `ip` binary is needed, so it
works in a minimal image.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from collections.abc import Mapping, Sequence

from services.base.errors import ConfigError

SIOCGIFADDR = 0x8915  # linux/sockios.h
# bootstrap.node_address: the address the node's default route leaves from
ROUTE = "route"


def node_address(setting: str) -> str:
    """The address this node is reached at: `bootstrap.node_address` as configured (a loopback
    address, checked when the experiment loads), or with "route" the default route's."""
    return route_address() if setting == ROUTE else setting


def route_address() -> str:
    """The address the node's default route leaves from (a UDP socket "connected" to a public
    address sends nothing), as Ray picks it itself; without a route, the host name's."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            address: str = probe.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())
    return address


def interface_addresses() -> dict[str, list[str]]:
    """Interface name -> its IPv4 addresses (those without one are left out)."""
    table: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # no IPv4 address
                continue
            table.setdefault(name, []).append(socket.inet_ntoa(reply[20:24]))
    return table


def interface_for(address: str, interfaces: Mapping[str, Sequence[str]]) -> str:
    """The interface holding `address`; a loopback address or one on no interface is refused,
    naming what was found."""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(f"node address {address!r}: not an IP address") from None
    if parsed.is_loopback:
        raise ConfigError(
            f"node address {address} is a loopback address (bootstrap.node_address sets it, or "
            "the host name resolves to it and no default route was found): the other nodes "
            'cannot reach it; set bootstrap.node_address = "route", give the node a route or '
            'set slime.socket_ifname (e.g. "ib0") and fix the host name resolution'
        )
    holders = sorted(name for name, found in interfaces.items() if address in found)
    if not holders:
        listed = ", ".join(
            f"{name} {' '.join(found)}" for name, found in sorted(interfaces.items())
        )
        raise ConfigError(
            f"node address {address} is on none of this node's interfaces ({listed}); "
            "set slime.socket_ifname to the interface the nodes share"
        )
    return holders[0]
