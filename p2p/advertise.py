"""Which address a node tells its peers (its `hello`'s gossip and HTTP addresses).

A node listening on one address advertises it. A node listening on a wildcard (`0.0.0.0`, `::`,
every interface) must name one address its peers can reach, and never the wildcard itself (a peer
that fetches from `0.0.0.0` fetches from itself). In order:

1. `--advertise HOST[:PORT]`, when given;
2. the address of the interface this host uses to reach its first bootstrap peer that resolves (the
   source address the kernel's routing table picks for it: a UDP `connect`, which sends no packet);
3. the host's one non-loopback interface address that is up (a host with several must be told:
   `AddressError` asking for `--advertise`; a host with none but loopback advertises loopback).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from p2p.errors import AddressError
from protocol.addresses import is_loopback_host, is_wildcard_host
from protocol.messages import split_addr

__all__ = ["Advertised", "choose_advertise_host"]

log = logging.getLogger("p2p.advertise")


@dataclass(frozen=True)
class Advertised:
    host: str
    why: str  # for the log line: how the host was chosen


def choose_advertise_host(listen_host: str, advertise_host: str, bootstrap: Sequence[str]) -> Advertised:
    """The host to advertise (see the module docstring). Blocking (name resolution): run it in a worker
    thread. Raises `AddressError("advertise", ...)` when no single address can be chosen."""
    if advertise_host:
        if is_wildcard_host(advertise_host):
            raise AddressError("advertise", f"cannot advertise the wildcard address {advertise_host}: "
                                            "name the address peers reach this host at")
        return Advertised(advertise_host, "--advertise")
    if not is_wildcard_host(listen_host):
        return Advertised(listen_host, "the listen address")
    want_v6 = ":" in listen_host  # "::" binds both families on Linux; "0.0.0.0" only IPv4
    for address in bootstrap:
        source = _source_address_towards(address, allow_v6=want_v6)
        if source is not None:
            return Advertised(source, f"the interface that reaches bootstrap peer {address}")
    candidates = _interface_addresses(allow_v6=want_v6)
    if len(candidates) == 1:
        return Advertised(candidates[0], "this host's only non-loopback address")
    if not candidates:
        return Advertised("127.0.0.1" if not want_v6 else "::1", "this host has no address but loopback")
    raise AddressError("advertise", f"listening on {listen_host} (every interface) and this host has several "
                                    f"addresses ({', '.join(candidates)}): pass --advertise HOST, the address "
                                    "peers reach this node at")


def _source_address_towards(address: str, *, allow_v6: bool) -> str | None:
    """The local address the routing table uses to reach `address` ("host:port"), or None if the
    host does not resolve or has no route. A UDP socket's `connect` only picks a route: no packet."""
    try:
        host, port = split_addr(address)
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (ValueError, OSError) as exc:
        log.info("bootstrap peer %s: cannot resolve (%s)", address, exc)
        return None
    for family, kind, proto, _, sockaddr in infos:
        if family == socket.AF_INET6 and not allow_v6:
            continue
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.connect(sockaddr)
            except OSError:
                continue
            source = probe.getsockname()[0]
        if not is_wildcard_host(source):
            return source
    return None


def _interface_addresses(*, allow_v6: bool) -> list[str]:
    """Non-loopback, non-link-local unicast addresses of the interfaces that are up, sorted."""
    stats = psutil.net_if_stats()
    found = set()
    for name, addrs in psutil.net_if_addrs().items():
        if name in stats and not stats[name].isup:
            continue
        for a in addrs:
            if a.family == socket.AF_INET or (allow_v6 and a.family == socket.AF_INET6):
                host = a.address.split("%", 1)[0]
                if is_loopback_host(host) or host.startswith(("169.254.", "fe80:")):
                    continue
                found.add(host)
    return sorted(found)
