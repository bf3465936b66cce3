"""The end of a run (`--max-rounds`): how nodes that ran the same rounds stop with equal digests.

Protocol. After its last update a node *drains*: it publishes nothing more, but keeps receiving,
serving blobs, forwarding gossip and catching up slots. Its heartbeats carry the state
`drain:<h>`, where `h` is the first 26 hex digits of its agreement hash (`node.outer.agreement.agreement_hex`:
the order-independent hash of the set of update ids its ledger has seen, `node.outer.agreement.IdSetHash`,
combined with the placement sum of which update sits in which slot). It stops waiting when every
connected peer is draining with the same `h` (everyone will publish no more, and everyone holds the same
updates at the same slots), then closes every slot that holds updates, says goodbye (signed),
checkpoints and prints `STOPPED`.

Why this ends with equal digests: the ledger digest is a function of the number of closed slots and
the ids applied per slot, and the parameters a function of those too (the ledger's invariant). Equal
agreement hashes give the same highest slot to close to, and the same ids at the same slots (two
replicas whose histories forked hold the same ids at different slots: their placement sums differ, and
the fork choice, `node.sync.repair`, settles them first).

Why it cannot deadlock: draining is "I will publish no more", not "I stopped listening"; a node waits
only for peers that are still connected, and a peer that left (goodbye, or silent past the heartbeat
timeout) is not waited for, nor is a peer this node's router has graylisted for misbehaving (it no
longer gossips with it, so their sets would never meet). Nobody waits for a goodbye.

A peer whose set differs (an update still in flight) is waited for until gossip delivers it; if its set
stays different for a few heartbeats with neither side changing, the node pulls the updates it lacks
from that peer's state snapshot (`node.sync.repair`), and the peer does the same with ours. The wait is
bounded twice, whatever the peers do: `quiet_s` without any progress (no new update, no change in any
peer's heartbeat) ends it with a warning, and so does `limit_s` (default `LIMIT_FACTOR × quiet_s`) from
its start, progress or not (a peer that trains on without `--max-rounds` keeps making progress).

`DrainTracker` is pure (time is an argument); the runtime feeds it `host.peers()` and its own state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["DRAIN_PREFIX", "LIMIT_FACTOR", "DrainDecision", "DrainTracker", "PeerView", "drain_state"]

DRAIN_PREFIX = "drain:"
HASH_CHARS = 26  # heartbeat state is at most 32 characters
LIMIT_FACTOR = 4.0  # the whole drain waits at most this many quiet bounds


def drain_state(set_hash_hex: str) -> str:
    """The heartbeat state of a draining node whose seen-set hash is `set_hash_hex`."""
    return DRAIN_PREFIX + set_hash_hex[:HASH_CHARS]


@dataclass(frozen=True)
class PeerView:
    """What the heartbeats tell about one connected peer (None: no heartbeat yet)."""

    peer_id: str
    state: str | None
    slot: int | None = None
    round: int | None = None


@dataclass(frozen=True)
class DrainDecision:
    done: bool
    why: str  # "agreed", "alone", "quiet-timeout", "time-limit" or "waiting"
    waiting_for: tuple[str, ...]  # peers not (yet) draining with our hash

    @property
    def agreed(self) -> bool:
        return self.why in ("agreed", "alone")

    def describe(self) -> str:
        return f"drain done ({self.why})" + (f"; peers not agreeing: {list(self.waiting_for)}" if self.waiting_for else "")


class DrainTracker:
    """Decides when a draining node stops waiting (see the module docstring)."""

    def __init__(self, started_at: float, quiet_s: float, limit_s: float | None = None) -> None:
        limit_s = LIMIT_FACTOR * quiet_s if limit_s is None else limit_s
        if quiet_s <= 0 or limit_s <= 0:
            raise ValueError("quiet_s and limit_s must be > 0")
        self.quiet_s = quiet_s
        self.limit_s = limit_s
        self.started_at = started_at
        self.last_progress = started_at
        self._signature: object = None
        self._since: dict[str, tuple[str | None, float]] = {}  # peer -> (state, when it took that state)
        self._own: tuple[str, float] | None = None  # our state and when we took it

    def update(self, now: float, own_state: str, peers: Sequence[PeerView]) -> DrainDecision:
        signature = (own_state, tuple(sorted((p.peer_id, p.state, p.slot, p.round) for p in peers)))
        if signature != self._signature:
            self._signature = signature
            self.last_progress = now
        if self._own is None or self._own[0] != own_state:
            self._own = (own_state, now)
        self._since = {p.peer_id: self._since[p.peer_id] if p.peer_id in self._since
                       and self._since[p.peer_id][0] == p.state else (p.state, now) for p in peers}
        waiting = tuple(sorted(p.peer_id for p in peers if p.state != own_state))
        if not waiting:
            return DrainDecision(True, "agreed" if peers else "alone", ())
        if now - self.last_progress >= self.quiet_s:
            return DrainDecision(True, "quiet-timeout", waiting)
        if now - self.started_at >= self.limit_s:
            return DrainDecision(True, "time-limit", waiting)
        return DrainDecision(False, "waiting", waiting)

    def diverged(self, now: float, min_s: float) -> list[tuple[str, str]]:
        """(peer, state) of connected draining peers whose update set has differed from ours, with
        neither side changing, for `min_s` seconds (as of the last `update`): gossip is not reconciling
        them, a repair pull may (`node.sync.repair`)."""
        if self._own is None:
            return []
        own, own_since = self._own
        return sorted((peer, state) for peer, (state, since) in self._since.items()
                      if state is not None and state.startswith(DRAIN_PREFIX) and state != own
                      and now - max(since, own_since) >= min_s)
