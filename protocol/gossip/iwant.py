"""IWANT accounting, both ways. Small pure classes of the router; `now` is an argument.

`IWantBudget` (answering): each peer may ask for `budget` ids per heartbeat: a bucket of `budget` ids,
refilled at `budget` per `heartbeat_s` (so peers whose heartbeats run at other times or a little faster are
not caught out). Every id listed counts, repeats and ids not held included. An id is answered once per peer
within `windows` heartbeats (the mcache window: the message cache forgets a forwarded message after as many),
however often it is asked. Ids past the budget are not answered, and `over` reports the peer once per
heartbeat, for a `flood` penalty.

`WantPacer` (asking): we ask one peer for at most `per_heartbeat` ids per heartbeat (half its budget, the
reference's `iwant_budget // 2`); wanted ids past that wait, per peer, for the next heartbeat (`due`), so an
honest node never exceeds a reference peer's budget, even answering an anti-entropy burst of IHAVEs.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence

__all__ = ["AskedIds", "IWantBudget", "WantPacer"]


class IWantBudget:
    def __init__(self, budget: int, heartbeat_s: float, windows: int) -> None:
        self.budget = budget
        self.rate = budget / heartbeat_s
        self._level: dict[str, tuple[float, float]] = {}  # peer -> (ids left, at when)
        self._answered: deque[dict[str, set[bytes]]] = deque([{}], maxlen=windows)
        self._reported: set[str] = set()  # peers reported over budget this heartbeat

    def take(self, peer: str, asked: int, now: float) -> tuple[int, bool]:
        """`asked` ids from `peer`: how many of them (the first ones) fit its budget, and whether it just went
        over it for the first time this heartbeat (then: penalize once)."""
        left, at = self._level.get(peer, (float(self.budget), now))
        left = min(float(self.budget), left + max(0.0, now - at) * self.rate)
        allowed = min(asked, int(left))
        self._level[peer] = (left - allowed, now)
        if allowed == asked or peer in self._reported:
            return allowed, False
        self._reported.add(peer)
        return allowed, True

    def answered_recently(self, peer: str, message_id: bytes) -> bool:
        return any(message_id in window.get(peer, ()) for window in self._answered)

    def answered(self, peer: str, message_id: bytes) -> None:
        self._answered[0].setdefault(peer, set()).add(message_id)

    def shift(self) -> None:
        """A heartbeat: a new dedup window (the oldest is forgotten); the over-budget reports start again."""
        self._answered.appendleft({})
        self._reported.clear()
        full = float(self.budget)
        self._level = {p: v for p, v in self._level.items() if v[0] < full}  # a full bucket needs no record


class WantPacer:
    def __init__(self, per_heartbeat: int, max_waiting: int) -> None:
        self.per_heartbeat = per_heartbeat
        self.max_waiting = max_waiting
        self._asked: Counter[str] = Counter()
        self._waiting: dict[str, dict[bytes, None]] = {}  # peer -> ids (in order, no repeats)

    def room(self, peer: str) -> int:
        """How many more ids we may ask `peer` for in this heartbeat."""
        return max(0, self.per_heartbeat - self._asked[peer])

    def asked(self, peer: str, n: int) -> None:
        self._asked[peer] += n

    def wait(self, peer: str, ids: Iterable[bytes]) -> None:
        """Ids `peer` announced that we want but had no room to ask for: asked at a later heartbeat (at most
        `max_waiting` per peer; the newest past that are dropped, they come back with the next announcement)."""
        waiting = self._waiting.setdefault(peer, {})
        for message_id in ids:
            if len(waiting) >= self.max_waiting:
                break
            waiting[message_id] = None

    def due(self) -> list[tuple[str, Sequence[bytes]]]:
        """A heartbeat: every peer's room starts again; returns the waiting ids, per peer (sorted), to want anew."""
        self._asked.clear()
        due = [(peer, tuple(ids)) for peer, ids in sorted(self._waiting.items())]
        self._waiting.clear()
        return due

    def forget_peer(self, peer: str) -> None:
        self._waiting.pop(peer, None)


class AskedIds:
    """The ids we asked for with IWANT and have not received, each with the peers that announced it: the one
    asked first, then others to try when the message comes as a header (they hold its blob). An id is asked
    again only after `timeout_s`; `expire` forgets what is older."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._asked: dict[bytes, float] = {}  # id -> when asked
        self._announcers: dict[bytes, list[str]] = {}  # id -> peers that announced it, the asked one first

    def __contains__(self, message_id: bytes) -> bool:
        return message_id in self._asked

    def may_ask(self, message_id: bytes, now: float) -> bool:
        return self._asked.get(message_id, -1e18) < now - self.timeout_s

    def ask(self, message_id: bytes, peer: str, now: float) -> None:
        self._asked[message_id] = now
        self._announcers[message_id] = [peer]

    def announced(self, message_id: bytes, peer: str) -> None:
        """`peer` announced an id asked elsewhere: a second holder to remember."""
        holders = self._announcers.setdefault(message_id, [])
        if peer not in holders:
            holders.append(peer)

    def take_announcers(self, message_id: bytes) -> list[str]:
        return self._announcers.pop(message_id, [])

    def expire(self, now: float) -> None:
        self._asked = {i: t for i, t in self._asked.items() if t >= now - self.timeout_s}
        self._announcers = {i: a for i, a in self._announcers.items() if i in self._asked}
