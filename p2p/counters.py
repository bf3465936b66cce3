"""Byte and frame counters per peer and per kind (control frames vs blobs), and rejections by reason.

One `Counters` object per host; every I/O path adds to it. Per-peer counts name at most `MAX_NAMED_PEERS`
peers (or remote hosts); later ones are counted together as `other`, so many keys or addresses cannot grow
memory, `/status` or the metric labels without bound. (The node's `/metrics` is `node.status`'s, through
prometheus_client.) `snapshot()` is JSON-ready for `/status`
and `/metrics`. Counting is synchronous and cheap (plain ints), safe from any trio task; the blob
paths that run in worker threads report back to the trio thread before counting.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass

from protocol.errors import Reason

UNKNOWN_PEER = "unknown"  # traffic before a handshake completed, or an HTTP client that named no peer
OTHER_PEERS = "other"  # every peer past the first MAX_NAMED_PEERS (totals stay exact; labels stay bounded)
MAX_NAMED_PEERS = 1024


class Kind(enum.StrEnum):
    CONTROL = "control"  # length-prefixed gossip frames on the TCP connections
    BLOB = "blob"  # HTTP blob bodies (frames = transfers)


@dataclass
class Traffic:
    sent_bytes: int = 0
    recv_bytes: int = 0
    sent_frames: int = 0
    recv_frames: int = 0

    def add(self, other: Traffic) -> None:
        self.sent_bytes += other.sent_bytes
        self.recv_bytes += other.recv_bytes
        self.sent_frames += other.sent_frames
        self.recv_frames += other.recv_frames


class Counters:
    """Monotonic counters; nothing here is ever reset while the host runs."""

    def __init__(self) -> None:
        self._traffic: dict[tuple[str, Kind], Traffic] = {}
        self.rejections: Counter[Reason] = Counter()
        self.rejections_by_peer: dict[str, Counter[Reason]] = {}
        self.dropped_frames: Counter[str] = Counter()  # per peer: send queue full
        self.blob_downloads = 0  # verified blobs fetched from peers
        self.blob_fetch_failures = 0  # attempts that failed and moved on to another holder
        self.blobs_served = 0  # complete bodies sent to peers
        self.events: Counter[str] = Counter()  # connects, disconnects, dials, ... by name
        self.queued_by_kind: Counter[str] = Counter()  # control bytes queued for sending, by message kind
        self._names: set[str] = {UNKNOWN_PEER, OTHER_PEERS}  # peers counted under their own name
        self.on_fetch: Callable[[float], None] | None = None  # told each successful blob download's seconds

    def _named(self, peer: str) -> str:
        """`peer` itself while fewer than MAX_NAMED_PEERS are named (or it already is), else OTHER_PEERS."""
        if peer in self._names or len(self._names) < MAX_NAMED_PEERS:
            self._names.add(peer)
            return peer
        return OTHER_PEERS

    def traffic(self, peer: str, kind: Kind) -> Traffic:
        key = (self._named(peer), kind)
        found = self._traffic.get(key)
        if found is None:
            found = self._traffic[key] = Traffic()
        return found

    def sent(self, peer: str, kind: Kind, nbytes: int, frames: int = 1) -> None:
        t = self.traffic(peer, kind)
        t.sent_bytes += nbytes
        t.sent_frames += frames

    def received(self, peer: str, kind: Kind, nbytes: int, frames: int = 1) -> None:
        t = self.traffic(peer, kind)
        t.recv_bytes += nbytes
        t.recv_frames += frames

    def rejected(self, peer: str, reason: Reason) -> None:
        self.rejections[reason] += 1
        self.rejections_by_peer.setdefault(self._named(peer), Counter())[reason] += 1

    def dropped(self, peer: str) -> None:
        """A frame for `peer` was dropped: its send queue was full."""
        self.dropped_frames[self._named(peer)] += 1

    def total(self, kind: Kind) -> Traffic:
        out = Traffic()
        for (_, k), t in self._traffic.items():
            if k == kind:
                out.add(t)
        return out

    def peers(self) -> list[str]:
        """Peers with any traffic (the `unknown` bucket only while it holds bytes)."""
        return sorted({p for (p, _), t in self._traffic.items() if t != Traffic()})

    def snapshot(self) -> dict[str, object]:
        """Everything, as plain JSON-able dicts."""
        return {
            "totals": {k.value: asdict(self.total(k)) for k in Kind},
            "peers": {
                p: {k.value: asdict(t) for (pp, k), t in self._traffic.items() if pp == p and t != Traffic()}
                for p in self.peers()
            },
            "rejections": {r.value: n for r, n in sorted(self.rejections.items())},
            "rejections_by_peer": {
                p: {r.value: n for r, n in sorted(c.items())} for p, c in sorted(self.rejections_by_peer.items())
            },
            "dropped_frames": dict(sorted(self.dropped_frames.items())),
            "blob_downloads": self.blob_downloads,
            "blob_fetch_failures": self.blob_fetch_failures,
            "blobs_served": self.blobs_served,
            "events": dict(sorted(self.events.items())),
            "queued_by_kind": dict(sorted(self.queued_by_kind.items())),
        }
