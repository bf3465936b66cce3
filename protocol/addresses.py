"""Which advertised addresses can reach a peer. Pure: no sockets, no name resolution.

A node tells its peers where to reach it (the `gossip_addr` and `http_addr` of its `hello`, spread on
by `peer_exchange` and `prune`). Some addresses can never reach it from elsewhere, and using them
does harm: a wildcard address (`0.0.0.0`, `::`) dialled or fetched from reaches the *receiver itself*
(its own blob server answers 404, its own listener answers with its own key), and a loopback address
sent over a connection from another host reaches the receiver's own machine. `address_problem` names
the problem, or returns None for an address worth using. Host names are taken as they are (checked
when dialled).
"""

from __future__ import annotations

import ipaddress

from protocol.messages import split_addr

__all__ = ["address_problem", "is_loopback_host", "is_wildcard_host", "peer_address_problem"]

_WILDCARD_NAMES = frozenset({"", "*", "0", "0.0.0.0", "::", "::0", "0:0:0:0:0:0:0:0"})


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


def is_wildcard_host(host: str) -> bool:
    """True for a listen-on-every-interface host (`0.0.0.0`, `::`): never an address to advertise."""
    ip = _ip(host)
    return host.strip("[]") in _WILDCARD_NAMES or (ip is not None and ip.is_unspecified)


def is_loopback_host(host: str) -> bool:
    """True for `localhost` and the loopback ranges (127.0.0.0/8, ::1)."""
    ip = _ip(host)
    return host.strip("[]").lower() == "localhost" or (ip is not None and ip.is_loopback)


def address_problem(addr: str, *, remote_host: str | None = None, own: frozenset[str] = frozenset()) -> str | None:
    """Why `addr`, advertised by a peer, cannot reach it; None if it may.

    `remote_host`: the host the advertisement came from (the connection's remote address), when known;
    `own`: this node's own advertised addresses (an address of ours names us, not the peer)."""
    try:
        host, _ = split_addr(addr)
    except ValueError as exc:
        return str(exc)
    ip = _ip(host)
    if is_wildcard_host(host):
        return f"{addr} is a wildcard address (it names every host, not the peer)"
    if ip is not None and (ip.is_multicast or (ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255"))):
        return f"{addr} is not a unicast address"
    if addr in own:
        return f"{addr} is this node's own address"
    if remote_host is not None and is_loopback_host(host) and not is_loopback_host(remote_host):
        return f"{addr} is a loopback address, sent from another host ({remote_host})"
    return None


def peer_address_problem(gossip_addr: str, http_addr: str, *, remote_host: str | None = None,
                         own: frozenset[str] = frozenset()) -> str | None:
    """The first problem of a peer's two advertised addresses (empty ones: not advertised, fine)."""
    problems = (address_problem(a, remote_host=remote_host, own=own) for a in (gossip_addr, http_addr) if a)
    return next((p for p in problems if p), None)
