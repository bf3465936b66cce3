"""Parameters of the gossip router. One frozen dataclass; tests shrink the intervals.

Mesh degrees follow gossipsub's naming: the router keeps between `d_lo` and `d_hi` mesh peers and
repairs toward `d`; it announces (IHAVE) to `d_lazy` non-mesh peers per heartbeat.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from protocol.errors import LocalProtocolError, Reason

TOPIC = "diloco"

# Penalty subtracted from a peer's score per refused message, by reason. DUPLICATE is normal gossip
# (several mesh peers forward the same header); PEER_BANNED is counted but the peer is already gone.
# 200 is "one strike": a peer that breaks the framing or the handshake after proving its key is
# disconnected and banned at once; -40 offences take three to cross the default threshold of -100.
DEFAULT_PENALTIES: dict[Reason, float] = {
    Reason.OVERSIZED: 200.0,
    Reason.TRUNCATED: 20.0,
    Reason.MALFORMED: 40.0,
    Reason.BAD_SCHEMA: 40.0,
    Reason.UNSUPPORTED_VERSION: 200.0,
    Reason.WRONG_RUN_ID: 200.0,
    Reason.CONFIG_MISMATCH: 0.0,  # misconfigured, not hostile: refused at the handshake, counted
    Reason.NOT_ADMITTED: 10.0,  # an update of a key outside a closed run; a goodbye of one not yet known to us
    Reason.DUPLICATE: 0.0,
    Reason.REPLAYED: 10.0,
    Reason.BAD_SIGNATURE: 40.0,
    Reason.BAD_IDENTITY: 40.0,
    Reason.BAD_HANDSHAKE: 200.0,
    Reason.BAD_ADDRESS: 0.0,  # a misconfigured peer, not a hostile one: its handshake is refused, or the address skipped
    Reason.BAD_CERTIFICATE: 200.0,  # refused in the TLS handshake, before any peer id is proven (keyed by host)
    Reason.CLEARTEXT_PEER: 0.0,  # misconfigured (--insecure on one side), not hostile: refused at the link
    Reason.TLS_PEER: 0.0,
    Reason.PEER_BANNED: 0.0,
    Reason.BAD_SLOT: 10.0,
    Reason.TOO_STALE: 0.0,
    Reason.PAST_END: 10.0,  # an update after the run's last slot: honest nodes never publish one
    Reason.BAD_CODEC: 40.0,
    Reason.SHAPE_MISMATCH: 40.0,
    Reason.NON_FINITE: 40.0,
    Reason.HASH_MISMATCH: 40.0,
    Reason.BAD_STATE: 20.0,
    Reason.BAD_CLAIM: 40.0,  # an update claiming more work than the run allows (signed: hostile, not broken)
    Reason.BAD_CHUNK: 40.0,  # counted by the state download (`node.sync.statefetch`), like a bad blob
    Reason.TOO_SLOW: 20.0,  # a blob fetch under the minimum rate: five in a row (less the rewards) ban a tarpit
    Reason.FLOOD: 20.0,  # IWANT ids past the budget, at most once a heartbeat: a peer that keeps it up is banned
}


@dataclass(frozen=True)
class ScoreConfig:
    """Peer scoring. A score starts at 0, drops by `penalties[reason]` per refused message, rises by
    `reward` per first delivery of a valid message (at most to `reward_cap`), and decays toward 0 by
    `decay` per heartbeat. Below `graylist` a peer gets no IHAVE and is not grafted; below
    `disconnect` it is disconnected and banned for `ban_s`."""

    penalties: dict[Reason, float] = field(default_factory=lambda: dict(DEFAULT_PENALTIES))
    reward: float = 1.0
    reward_cap: float = 20.0
    decay: float = 0.98
    graylist: float = -20.0
    disconnect: float = -100.0
    ban_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0.0 < self.decay <= 1.0:
            raise LocalProtocolError("decay must be in (0, 1]")
        if not self.disconnect < self.graylist <= 0.0:
            raise LocalProtocolError("need disconnect < graylist <= 0")
        missing = set(Reason) - set(self.penalties)
        if missing:
            raise LocalProtocolError(f"penalties missing for {sorted(r.value for r in missing)}")


@dataclass(frozen=True)
class GossipConfig:
    run_id: str
    topic: str = TOPIC
    d: int = 4
    d_lo: int = 3
    d_hi: int = 8
    d_lazy: int = 4
    d_score: int = 2
    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 5.0  # silence longer than this: the peer is considered dead
    target_peers: int = 8  # dial known peers while fewer are connected
    max_peers: int = 32  # refuse connections beyond this
    min_outbound: int = 2  # keep dialling until this many peers are ones we dialled; inbound ones leave them room
    # Places in the peer table for peers that dial in (`protocol.gossip.places`): at most this many per global IP
    # address and per global /24 (IPv4) or /48 (IPv6); a local address (loopback, private, link-local: one
    # machine or one LAN, where honest nodes share an address and a cluster shares a /24) has only its own cap
    max_peers_per_address: int = 4
    max_peers_per_prefix: int = 8
    max_peers_per_local_address: int = 16  # a local testnet of up to 17 nodes on 127.0.0.1 is never refused
    max_dials_per_heartbeat: int = 4
    dial_backoff_s: float = 0.5  # first retry delay; doubles per failure, +-50% jitter
    dial_backoff_max_s: float = 30.0
    prune_backoff_s: int = 10  # asked of a pruned peer before it grafts again
    mcache_windows: int = 6  # heartbeats a forwarded message stays answerable to IWANT
    gossip_windows: int = 3  # heartbeats a message is announced with IHAVE
    iwant_timeout_s: float = 3.0  # an unanswered IWANT may be asked of another peer after this
    px_peers: int = 16  # peer infos per PeerExchange
    px_every: int = 5  # heartbeats between periodic peer exchanges
    max_ihave_ids: int = 500  # ids per IHAVE / IWANT message (the schema allows up to 5000)
    # IWANT ids a peer may ask per heartbeat (`protocol.gossip.iwant`: a bucket of this size refilled every
    # heartbeat_s); an id is answered once per peer per mcache_windows heartbeats; past the budget ids go
    # unanswered and the peer is penalized (`flood`, once a heartbeat). We ask a peer for at most half of it.
    iwant_budget: int = 1000
    # Anti-entropy (heals partitions): signed update headers stay answerable to IWANT for
    # `history_s` seconds (rounded up to heartbeats; at most `history_max` of them, ~200 bytes
    # each), and every held id a peer is not known to have is announced to it on (re)connect and,
    # every `anti_entropy_every` heartbeats (0: never), to one random peer. A peer that already
    # accepted such a message but forgot it from its seen-cache (TTL 120 s by default) may ask for
    # it again: its validator refuses it as REPLAYED, which the router does not penalize.
    history_s: float = 600.0
    history_max: int = 10_000
    anti_entropy_every: int = 30
    max_fetches_per_holder: int = 2  # blob fetches in flight from one peer (a tarpit never takes every slot)
    slow_holder_s: float = 300.0  # a holder that was too slow is tried after all others for this long
    reduced_records: bool = False  # carry `reduced` records (a reduced run, PROTOCOL.md §15a); refused otherwise
    score: ScoreConfig = field(default_factory=ScoreConfig)

    def __post_init__(self) -> None:
        if not self.run_id:
            raise LocalProtocolError("run_id must be non-empty")
        if not 0 < self.d_lo <= self.d <= self.d_hi:
            raise LocalProtocolError("need 0 < d_lo <= d <= d_hi")
        if not 0 <= self.d_score <= self.d:
            raise LocalProtocolError("need 0 <= d_score <= d")
        if self.heartbeat_s <= 0 or self.heartbeat_timeout_s <= self.heartbeat_s:
            raise LocalProtocolError("need 0 < heartbeat_s < heartbeat_timeout_s")
        if not 0 < self.gossip_windows <= self.mcache_windows:
            raise LocalProtocolError("need 0 < gossip_windows <= mcache_windows")
        if not 0 < self.max_ihave_ids <= 5000:
            raise LocalProtocolError("need 0 < max_ihave_ids <= 5000 (MessageIds)")
        if self.history_s < 0 or self.history_max < 0 or self.anti_entropy_every < 0:
            raise LocalProtocolError("history_s, history_max and anti_entropy_every must be >= 0")
        if self.max_peers < self.target_peers:
            raise LocalProtocolError("max_peers must be >= target_peers")
        if min(self.max_peers_per_address, self.max_peers_per_prefix, self.max_peers_per_local_address) < 1:
            raise LocalProtocolError("max_peers_per_address, _per_prefix and _per_local_address must be >= 1")
        if self.iwant_budget < 2:
            raise LocalProtocolError("need iwant_budget >= 2")

    @property
    def history_heartbeats(self) -> int:
        """`history_s` in heartbeats (rounded up)."""
        return math.ceil(self.history_s / self.heartbeat_s)
