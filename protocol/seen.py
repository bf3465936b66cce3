"""Freshness state for gossiped messages: a seen-cache of message ids, a per-origin seqno window, and
the seqno source an origin uses. Pure classes; `now` is Unix time in seconds, passed in.

Why both: the seen-cache stops the normal gossip duplicates cheaply but must forget (memory). The seqno
window remembers, per origin, which seqnos it accepted over the last `window_s` (and a tag of the message
each was accepted with), and refuses anything older than that outright, so a replay that arrives after
its seen-cache entry expired is still refused. An exact copy of an accepted message that arrives after its
id left the seen-cache (an honest peer forwarding a message it fetched late, or answering an IWANT) is
still a plain duplicate, not a replay: only another message under an accepted seqno is one. Gossip
reorders, so any unseen seqno inside the window is accepted.

Seqnos are microseconds since the Unix epoch at creation (`SeqnoSource`), so a restarted node's fresh
messages are newer than everything it sent before, without persisting a counter, and a receiver that
never heard of an origin can still refuse a message captured long ago. Nodes need clocks within
`window_s` of each other (NTP); a node whose clock lags by more sees its messages refused as REPLAYED.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from dataclasses import dataclass, field

from cachetools import TTLCache

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError

MICROS = 1_000_000


class SeenCache:
    """Message ids seen in the last `ttl_s` seconds, at most `max_entries` (oldest forgotten first).

    A `cachetools.TTLCache` whose timer is the `now` of the current call, never a clock of its own: an
    id expires once `now >= added + ttl_s`; when full, the id added (or re-added) longest ago goes
    (lookups with `contains` do not refresh an id).

    Contract: `now` must not go backwards between calls (ids expire in insertion order)."""

    def __init__(self, ttl_s: float = 120.0, max_entries: int = 200_000) -> None:
        if ttl_s <= 0 or max_entries <= 0:
            raise LocalProtocolError("ttl_s and max_entries must be positive")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._now = -math.inf  # the `now` of the call in progress: the TTLCache's only clock
        self._ids: TTLCache[bytes, None] = TTLCache(max_entries, ttl_s, timer=self._time)

    def _time(self) -> float:
        return self._now

    def __len__(self) -> int:
        return len(self._ids)

    def contains(self, message_id: bytes, now: float) -> bool:
        self.expire(now)
        return message_id in self._ids

    def add(self, message_id: bytes, now: float) -> None:
        self._now = now
        self._ids[message_id] = None  # expires what is due, then evicts the oldest if full

    def expire(self, now: float) -> None:
        self._now = now
        self._ids.expire(now)


@dataclass
class _Origin:
    high: int = 0  # largest accepted seqno
    low: int = 0  # seqnos <= low are refused (raised when the per-origin set overflows)
    heap: list[int] = field(default_factory=list)
    accepted: dict[int, int] = field(default_factory=dict)  # seqno -> tag of the message id accepted with it


def _tag(message_id: bytes) -> int:
    """The first 8 bytes of a message id: enough to tell an exact copy from another message (ids are
    SHA-256 digests; a forger who matched 64 bits would only get its message dropped without penalty)."""
    return int.from_bytes(message_id[:8], "big")


class ReplayWindow:
    """Per-origin seqno window. A seqno is refused (REPLAYED) if it was accepted before with another
    message, or if it is not newer than `max(now, newest accepted from that origin) - window_s`; the very
    message it was accepted with is a DUPLICATE.

    `check` only reads; call `record` once the message passed every other check. Memory is bounded:
    at most `max_origins` origins (least recently active forgotten: for them only the absolute
    `now - window_s` floor remains) and `max_per_origin` seqnos each (the oldest are dropped and the
    floor raised past them, so they stay refused)."""

    def __init__(self, window_s: float = 3600.0, max_origins: int = 10_000, max_per_origin: int = 65_536) -> None:
        if window_s <= 0 or max_origins <= 0 or max_per_origin <= 0:
            raise LocalProtocolError("window_s, max_origins and max_per_origin must be positive")
        self.window_us = int(window_s * MICROS)
        self.max_origins = max_origins
        self.max_per_origin = max_per_origin
        self._origins: OrderedDict[str, _Origin] = OrderedDict()

    def __len__(self) -> int:
        return len(self._origins)

    def floor(self, origin: str, now: float) -> int:
        """Seqnos at or below this are refused for `origin`."""
        state = self._origins.get(origin)
        newest = max(int(now * MICROS), state.high if state else 0)
        return max(newest - self.window_us, state.low if state else 0)

    def check(self, origin: str, seqno: int, now: float, message_id: bytes) -> None:
        if seqno <= self.floor(origin, now):
            raise RemoteProtocolError(Reason.REPLAYED, f"seqno {seqno} of {origin} is older than the replay window")
        state = self._origins.get(origin)
        if state is not None and (tag := state.accepted.get(seqno)) is not None:
            if tag == _tag(message_id):
                raise RemoteProtocolError(Reason.DUPLICATE, f"seqno {seqno} of {origin}: accepted before")
            raise RemoteProtocolError(Reason.REPLAYED, f"seqno {seqno} of {origin} was already accepted")

    def record(self, origin: str, seqno: int, now: float, message_id: bytes) -> None:
        state = self._origins.pop(origin, None) or _Origin()
        self._origins[origin] = state  # most recently active last
        if seqno not in state.accepted:
            state.accepted[seqno] = _tag(message_id)
            heapq.heappush(state.heap, seqno)
        state.high = max(state.high, seqno)
        floor = self.floor(origin, now)
        while state.heap and (state.heap[0] <= floor or len(state.heap) > self.max_per_origin):
            dropped = heapq.heappop(state.heap)
            state.accepted.pop(dropped, None)
            state.low = max(state.low, dropped) if dropped > floor else state.low
        while len(self._origins) > self.max_origins:
            self._origins.popitem(last=False)


class SeqnoSource:
    """Issues an origin's seqnos: strictly increasing, and at least the current time in microseconds.

    `last` seeds it (e.g. from a checkpoint) so seqnos stay increasing even if the clock stepped back."""

    def __init__(self, last: int = 0) -> None:
        self.last = last

    def next(self, now: float) -> int:
        self.last = max(self.last + 1, int(now * MICROS))
        return self.last
