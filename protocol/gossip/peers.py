"""The table of known peers: where to reach them and whether they said goodbye. Pure; `now` passed in.

Peers enter from handshakes (first-hand: the Hello is covered by the HelloProof) and from peer exchange
(hearsay: an address learned that way is only a dial candidate, and a dial checks the peer id in the
handshake). A peer that said goodbye is not dialled again until it reconnects.

Against eclipsing (a hostile peer flooding peer exchanges with addresses of its own keys): peers this node
has been connected to are dialled before any hearsay, and the bound (`max_entries`) drops hearsay first,
the entries heard of longest ago first; a first-hand entry goes only when no hearsay is left.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from protocol.messages import Heartbeat, PeerInfo


@dataclass
class PeerRecord:
    info: PeerInfo
    last_heard: float  # when we last connected to it or were told about it
    left: bool = False  # it sent a signed goodbye
    first_hand: bool = False  # we have been connected to it (its addresses were authenticated)


class PeerTable:
    def __init__(self, local_peer: str, max_entries: int = 10_000) -> None:
        self.local_peer = local_peer
        self.max_entries = max_entries
        self._records: dict[str, PeerRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, peer: str) -> bool:
        return peer in self._records

    def get(self, peer: str) -> PeerRecord | None:
        return self._records.get(peer)

    def learn(self, info: PeerInfo, now: float) -> bool:
        """Hearsay from peer exchange. Returns True if the peer was new. Never overrides an address
        learned first-hand and never revives a peer that left."""
        if info.peer_id == self.local_peer or not info.gossip_addr:
            return False
        record = self._records.get(info.peer_id)
        if record is not None:
            return False
        self._records[info.peer_id] = PeerRecord(info, now)
        self._bound()
        return True

    def connected(self, info: PeerInfo, now: float) -> None:
        """First-hand: a handshake with this peer just completed (its addresses are authenticated)."""
        self._records[info.peer_id] = PeerRecord(info, now, left=False, first_hand=True)
        self._bound()

    def left(self, peer: str) -> None:
        record = self._records.get(peer)
        if record is not None:
            record.left = True

    def forget(self, peer: str) -> None:
        self._records.pop(peer, None)

    def dial_candidates(self, exclude: set[str]) -> list[PeerInfo]:
        """Peers worth dialling (not left, not in `exclude`): first-hand ones, then hearsay, each most recently
        heard first."""
        records = [r for p, r in self._records.items() if p not in exclude and not r.left and r.info.gossip_addr]
        records.sort(key=lambda r: (not r.first_hand, -r.last_heard, r.info.peer_id))
        return [r.info for r in records]

    def sample(self, n: int, rng: random.Random, exclude: set[str]) -> tuple[PeerInfo, ...]:
        """Up to `n` random live peers for a peer exchange."""
        infos = sorted(
            (r.info for p, r in self._records.items() if p not in exclude and not r.left and r.info.gossip_addr),
            key=lambda i: i.peer_id,
        )
        return tuple(rng.sample(infos, min(n, len(infos))))

    def _bound(self) -> None:
        if len(self._records) > self.max_entries:
            oldest = sorted(self._records.values(), key=lambda r: (r.first_hand, r.last_heard))
            for record in oldest[: len(self._records) - self.max_entries]:
                del self._records[record.info.peer_id]


@dataclass
class PeerState:
    """One connected peer, as the router sees it."""

    info: PeerInfo
    conn: int
    outbound: bool
    since: float
    last_recv: float
    graft_after: float = 0.0  # they pruned us: no Graft to them before this
    sent_heartbeats: int = 0
    heartbeat: Heartbeat | None = None  # their latest
    address: str = ""  # the IP (or host name) the connection is with: `protocol.gossip.places` caps and groups
