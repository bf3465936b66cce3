"""Updates whose blob is not here yet, and who can serve each blob. A small pure class of the router.

Contract:
- at most one fetch per blob is in flight (`fetching`), so a node downloads each blob once: a fetch
  from a peer that disconnects stays in flight until it reports its end (`done`, `failed`), for the
  blob comes over its own HTTP connection, which may well finish after the gossip connection went
  silent (a killed holder resets it at once; a vanished one fails at the client's rate floor);
- at most `per_holder` fetches are in flight from one peer: a blob whose holders are all that busy
  waits, and starts when one of their fetches ends (`done`, `failed`) or at the next `retry`. A tarpit
  (a holder that trickles its bytes) so never takes every download slot of the host;
- holders (peers that sent the header, or an IHAVE for it: they hold the blob) are tried in the
  order heard, and only while connected; a holder that was too slow (`failed(..., slow_until=T)`)
  comes after every other holder until `T`, with one fetch in flight at most;
- a holder that served wrong bytes, or said it does not hold the blob (`failed(..., bad=True)`), is
  never asked again for that blob; one that could not be reached is asked again after the next `retry`;
- an entry nobody could serve for `ttl` seconds is given up at `retry`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from protocol.gossip.actions import Fetch
from protocol.messages import Signed


@dataclass
class PendingBlob:
    message: Signed
    blob: str
    size: int
    since: float
    holders: list[str] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)  # could not be reached: retried later
    bad: set[str] = field(default_factory=set)  # served wrong bytes: never again
    fetching: str | None = None


class PendingBlobs:
    def __init__(self, per_holder: int = 2) -> None:
        self.per_holder = per_holder
        self._by_blob: dict[str, PendingBlob] = {}
        self._in_flight: Counter[str] = Counter()  # fetches in flight, by holder
        self._slow_until: dict[str, float] = {}  # holders that were too slow, tried last until then
        self.given_up = 0  # entries dropped by `retry`: no holder served them within the ttl

    def __len__(self) -> int:
        return len(self._by_blob)

    def __contains__(self, blob: str) -> bool:
        return blob in self._by_blob

    def get(self, blob: str) -> PendingBlob | None:
        return self._by_blob.get(blob)

    def add(self, message: Signed, blob: str, size: int, now: float) -> PendingBlob:
        """Start waiting for `blob` (idempotent)."""
        entry = self._by_blob.get(blob)
        if entry is None:
            entry = self._by_blob[blob] = PendingBlob(message, blob, size, now)
        return entry

    def holder(self, blob: str, peer: str, connected: Collection[str]) -> list[Fetch]:
        """`peer` can serve `blob`; returns the Fetch to start, if one should start now."""
        entry = self._by_blob.get(blob)
        if entry is None:
            return []
        if peer not in entry.holders and peer not in entry.bad:
            entry.holders.append(peer)
        return self._next(entry, connected)

    def holder_of_message(self, message_id: bytes, peer: str, connected: Collection[str]) -> list[Fetch]:
        for entry in self._by_blob.values():
            if entry.message.message_id == message_id:
                return self.holder(entry.blob, peer, connected)
        return []

    def failed(self, blob: str, peer: str, bad: bool, connected: Collection[str],
               slow_until: float | None = None) -> list[Fetch]:
        """The fetch of `blob` from `peer` failed; returns the next Fetch, if any holder is left.
        A late report about a fetch that is no longer the current one is ignored. `slow_until`: the
        holder was too slow; other holders come first until then."""
        if slow_until is not None:
            self._slow_until[peer] = slow_until
        entry = self._by_blob.get(blob)
        if entry is None or entry.fetching not in (peer, None):
            return []
        freed = self._stop(entry)
        if bad:
            entry.bad.add(peer)
            if peer in entry.holders:
                entry.holders.remove(peer)
        else:
            entry.tried.add(peer)
        return self._next(entry, connected) + self._waiting_for(freed, connected)

    def done(self, blob: str, connected: Collection[str]) -> tuple[PendingBlob | None, list[Fetch]]:
        """The blob is stored: stop waiting; returns what was waiting for it, and the fetches that its
        holder's freed capacity lets start."""
        entry = self._by_blob.pop(blob, None)
        if entry is None:
            return None, []
        return entry, self._waiting_for(self._stop(entry), connected)

    def drop_peer(self, peer: str) -> None:
        """`peer` disconnected: it is no longer a holder to try. A fetch from it that is in flight stays
        so (and counted against it) until it reports its end: if it finishes, the blob came once."""
        for entry in self._by_blob.values():
            if peer in entry.holders:
                entry.holders.remove(peer)
        self._slow_until.pop(peer, None)

    def retry(self, now: float, ttl: float, connected: Collection[str]) -> list[Fetch]:
        """Once per heartbeat: unreachable holders get another chance; hopeless entries go."""
        self._slow_until = {peer: until for peer, until in self._slow_until.items() if until > now}
        out: list[Fetch] = []
        for blob, entry in list(self._by_blob.items()):
            if entry.fetching is None and entry.since < now - ttl:
                del self._by_blob[blob]
                self.given_up += 1
                continue
            entry.tried.clear()
            out += self._next(entry, connected)
        return out

    def _next(self, entry: PendingBlob, connected: Collection[str]) -> list[Fetch]:
        if entry.fetching is not None:
            return []
        ready = [h for h in entry.holders if h not in entry.tried and h in connected]
        for holder in sorted(ready, key=lambda h: h in self._slow_until):  # stable: the order heard
            if self._in_flight[holder] < (1 if holder in self._slow_until else self.per_holder):
                entry.fetching = holder
                self._in_flight[holder] += 1
                return [Fetch(holder, entry.blob, entry.size)]
        return []

    def _stop(self, entry: PendingBlob) -> str | None:
        """`entry`'s fetch ended; returns the holder it was from (now with room for another), if any."""
        holder, entry.fetching = entry.fetching, None
        if holder is not None and self._in_flight[holder] > 0:
            self._in_flight[holder] -= 1
            if not self._in_flight[holder]:
                del self._in_flight[holder]
        return holder

    def _waiting_for(self, holder: str | None, connected: Collection[str]) -> list[Fetch]:
        """The next fetch that waited for room at `holder` (the first blob heard that it can serve)."""
        if holder is None:
            return []
        for entry in self._by_blob.values():
            if entry.fetching is None and holder in entry.holders:
                if started := self._next(entry, connected):
                    return started
        return []
