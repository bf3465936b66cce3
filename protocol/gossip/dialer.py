"""Which addresses the router dials: the one owner of outstanding dials and of the bootstrap addresses.
A small pure class of the router; `now` is an argument.

Rules:
- dial while fewer than `target_peers` are connected, or while fewer than `min_outbound` (at most
  `target_peers`) of the connected peers are ones we dialled (keys dialling in, however many, cannot stop
  us reaching peers we chose);
- at most `max_dials_per_heartbeat` new dials at a time, counting the ones outstanding;
- candidates: the peer table's (`PeerTable.dial_candidates`: first-hand before hearsay), not banned,
  each peer id and address past its backoff (`DialSchedule`); then the bootstrap addresses whose peer is
  not connected;
- inbound connections leave `min_outbound` of the `max_peers` places to peers we dial (`inbound_full`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from protocol.gossip.actions import Dial
from protocol.gossip.backoff import DialSchedule
from protocol.gossip.config import GossipConfig
from protocol.gossip.peers import PeerState, PeerTable


class Dialer:
    def __init__(self, config: GossipConfig, bootstrap: Sequence[str], schedule: DialSchedule) -> None:
        self.config = config
        self.bootstrap = list(bootstrap)
        self.schedule = schedule
        self.dialing: dict[str, str | None] = {}  # address -> expected peer, while a Dial is outstanding
        self._bootstrap_peer: dict[str, str] = {}  # bootstrap address -> the peer found there
        self.min_outbound = min(config.min_outbound, config.target_peers)

    def connected(self, dialed: str, peer: str) -> None:
        """Our dial of `dialed` reached `peer`."""
        self.dialing.pop(dialed, None)
        if dialed in self.bootstrap:
            self._bootstrap_peer[dialed] = peer
        self.schedule.succeeded(dialed)

    def failed(self, address: str, now: float) -> None:
        self.dialing.pop(address, None)
        self.schedule.failed(address, now)

    def inbound_full(self, peers: Mapping[str, PeerState]) -> bool:
        """No place left for one more peer that dialled us."""
        return sum(not p.outbound for p in peers.values()) >= self.config.max_peers - self.min_outbound

    def plan(self, peers: Mapping[str, PeerState], table: PeerTable, banned: Callable[[str], bool],
             now: float) -> list[Dial]:
        cfg = self.config
        outbound = sum(p.outbound for p in peers.values())
        wanted = max(cfg.target_peers - len(peers), self.min_outbound - outbound)
        budget = min(cfg.max_dials_per_heartbeat, wanted - len(self.dialing))
        out: list[Dial] = []
        if budget <= 0:
            return out
        exclude = set(peers) | {p for p in self.dialing.values() if p is not None}
        for info in table.dial_candidates(exclude):
            if len(out) >= budget:
                break
            address = info.gossip_addr
            if address in self.dialing or banned(info.peer_id):
                continue
            if self.schedule.ready(info.peer_id, now) and self.schedule.ready(address, now):
                self.dialing[address] = info.peer_id
                out.append(Dial(address, info.peer_id))
        for address in self.bootstrap:
            if len(out) >= budget:
                break
            known = self._bootstrap_peer.get(address)
            if address in self.dialing or (known is not None and known in peers):
                continue
            if self.schedule.ready(address, now):
                self.dialing[address] = None
                out.append(Dial(address, None))
        return out
