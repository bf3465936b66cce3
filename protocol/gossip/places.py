"""Who gets a place in the peer table when a handshake completes with a new peer. Pure functions of the
connected peers; the router asks `place_for` on every `connected` of a peer it does not hold yet.

A peer's *address* is the IP its connection is with (the one it dialled in from, or the one we dialled), and
its *group* (`group_of`) is where one operator most likely sits: for a global address its /24 (IPv4) or /48
(IPv6) prefix; for a local one (loopback, private, link-local, or a host name) the address itself, since a
machine or a LAN holds many honest nodes (every node of a local testnet is on 127.0.0.1, and a cluster's
machines share a /24).

Rules (PROTOCOL.md section 7, "Places"), in this order:

1. A peer that dials in is refused while `max_peers_per_address` peers of its address are connected
   (`max_peers_per_local_address` for a local address), or `max_peers_per_prefix` peers of its global prefix.
   Peers we dialled count, but are never refused by the caps (they are our own choice).
2. A full table (`max_peers`, or for a peer that dials in the inbound share, `Dialer.inbound_full`) takes the
   newcomer only by evicting one peer: a peer that dialled in (never one we dialled) and whose score is not
   positive (it never delivered a valid message first, or that was long ago), from the group holding the
   most connected peers among such candidates, provided that group holds at least two more peers than the
   newcomer's group (so that keys from one place cannot push out peers from elsewhere, and two groups of
   equal size do not trade places forever); within the group, the lowest score, then the most recently
   connected, then the smallest peer id. Ties between groups: the group named first (bytewise).
3. Otherwise the newcomer is refused ("too many peers"); the router sends it a `peer_exchange` first.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from protocol.gossip.config import GossipConfig
from protocol.gossip.peers import PeerState

__all__ = ["Place", "address_of", "group_of", "is_local", "place_for", "prefix_of"]

_IP = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ip(address: str) -> _IP | None:
    try:
        ip = ipaddress.ip_address(address.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_of(remote: str | None) -> str:
    """The address part of a connection's remote end: `"1.2.3.4:5"` -> `"1.2.3.4"`, `"[::1]:5"` -> `"::1"`,
    an IPv4-mapped IPv6 address as IPv4, a host name lower-cased; `""` if unknown."""
    if not remote:
        return ""
    host = remote.rpartition(":")[0] if remote.count(":") == 1 or remote.startswith("[") else remote
    ip = _ip(host)
    return str(ip) if ip is not None else host.strip("[]").lower()


def is_local(address: str) -> bool:
    """Loopback, private, link-local, unknown or a host name: not a place on the public Internet."""
    ip = _ip(address)
    return ip is None or not ip.is_global


def prefix_of(address: str) -> str | None:
    """The /24 (IPv4) or /48 (IPv6) network of a global address; None for a local one."""
    ip = _ip(address)
    if ip is None or not ip.is_global:
        return None
    bits = 24 if ip.version == 4 else 48
    return str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


def group_of(address: str) -> str:
    """The eviction group: a global address's prefix, a local address itself."""
    return prefix_of(address) or address


@dataclass(frozen=True)
class Place:
    """`place_for`'s decision: take the newcomer (after evicting `evict`, if set), or refuse it (`refusal`)."""

    refusal: str = ""
    evict: str | None = None

    @property
    def accepted(self) -> bool:
        return not self.refusal


def place_for(
    address: str,
    outbound: bool,
    peers: Mapping[str, PeerState],
    config: GossipConfig,
    score: Callable[[str], float],
    *,
    full: bool,
) -> Place:
    """Whether a new peer at `address` (`address_of` its connection) gets a place; `full`: the table has none
    free for it. The rules are the module docstring's; the result depends only on the arguments."""
    if not outbound:
        same = sum(1 for p in peers.values() if p.address == address)
        cap = config.max_peers_per_local_address if is_local(address) else config.max_peers_per_address
        if same >= cap:
            return Place(refusal=f"too many peers from {address or 'an unknown address'} ({same})")
        prefix = prefix_of(address)
        if prefix is not None:
            in_prefix = sum(1 for p in peers.values() if prefix_of(p.address) == prefix)
            if in_prefix >= config.max_peers_per_prefix:
                return Place(refusal=f"too many peers from {prefix} ({in_prefix})")
    if not full:
        return Place()
    victim = _victim(group_of(address), peers, score)
    return Place(evict=victim) if victim is not None else Place(refusal="too many peers")


def _victim(newcomer_group: str, peers: Mapping[str, PeerState], score: Callable[[str], float]) -> str | None:
    groups = {peer: group_of(state.address) for peer, state in peers.items()}
    sizes = Counter(groups.values())
    candidates = [p for p, state in peers.items() if not state.outbound and score(p) <= 0]
    if not candidates:
        return None
    largest = min({groups[p] for p in candidates}, key=lambda g: (-sizes[g], g))
    if sizes[largest] < sizes[newcomer_group] + 2:
        return None
    in_group = [p for p in candidates if groups[p] == largest]
    return min(in_group, key=lambda p: (score(p), -peers[p].since, p))
