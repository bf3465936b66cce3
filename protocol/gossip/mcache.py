"""Held signed messages: a short gossipsub window for routine lazy gossip, and a longer, bounded
history for anti-entropy. Pure; one window per heartbeat (`shift`).

- Every held message is answerable to IWANT while it is in the cache.
- The newest `gossip_windows` heartbeats of messages are announced with IHAVE (`gossip_ids`).
- A message put with `keep=False` is forgotten after `windows` heartbeats (gossipsub's mcache).
- A message put with `keep=True` (signed update headers, ~200 bytes each) stays for
  `history_windows` heartbeats, at most `history_max` of them (oldest forgotten first), so a peer
  that was cut off for several rounds can be told about it when it comes back (`held_ids`).

Only messages this node *holds* enter the cache (for an update: its blob is stored here), so an IHAVE
is also a promise that the blob can be fetched from us; the router `forget`s a message whose blob
left the store. Each entry remembers which peers are known to have the message (they sent it to us,
or we sent it to them), so it is neither announced nor pushed to them again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from protocol.errors import LocalProtocolError
from protocol.messages import Signed


@dataclass
class CacheEntry:
    message: Signed
    known_by: set[str] = field(default_factory=set)


class MessageCache:
    def __init__(self, windows: int, gossip_windows: int, history_windows: int = 0, history_max: int = 0) -> None:
        if not 0 < gossip_windows <= windows:
            raise LocalProtocolError("need 0 < gossip_windows <= windows")
        if history_windows < 0 or history_max < 0:
            raise LocalProtocolError("history_windows and history_max must be >= 0")
        self.gossip_windows = gossip_windows
        self.history_windows = max(history_windows, windows)
        self.history_max = history_max
        self._windows: deque[list[bytes]] = deque([[]], maxlen=windows)
        self._entries: dict[bytes, CacheEntry] = {}
        self._history: OrderedDict[bytes, int] = OrderedDict()  # kept id -> heartbeat it arrived in
        self._tick = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, message_id: bytes) -> bool:
        return message_id in self._entries

    def put(self, message: Signed, known_by: set[str], *, keep: bool = False) -> CacheEntry:
        """Add a held message (idempotent: a second put only merges `known_by`). `keep`: retain it
        in the long history, not only for the short window."""
        entry = self._entries.get(message.message_id)
        if entry is None:
            entry = self._entries[message.message_id] = CacheEntry(message, set(known_by))
            self._windows[0].append(message.message_id)
            if keep and self.history_max > 0:
                self._history[message.message_id] = self._tick
                while len(self._history) > self.history_max:
                    self._entries.pop(self._history.popitem(last=False)[0], None)
        else:
            entry.known_by |= known_by
        return entry

    def get(self, message_id: bytes) -> CacheEntry | None:
        return self._entries.get(message_id)

    def forget(self, message_id: bytes) -> None:
        """Stop holding `message_id` (no more IHAVE or IWANT answers for it)."""
        self._entries.pop(message_id, None)
        self._history.pop(message_id, None)

    def gossip_ids(self) -> list[bytes]:
        """Ids to announce this heartbeat, newest first."""
        out: list[bytes] = []
        for i, window in enumerate(self._windows):
            if i >= self.gossip_windows:
                break
            out.extend(m for m in reversed(window) if m in self._entries)
        return out

    def held_ids(self) -> list[bytes]:
        """Every id held now (short window and long history), oldest first."""
        return list(self._entries)

    def held_ids_chunked(self, peer: str, size: int) -> list[tuple[bytes, ...]]:
        """Held ids `peer` is not known to have, oldest first, in tuples of at most `size`."""
        ids = [m for m, entry in self._entries.items() if peer not in entry.known_by]
        return [tuple(ids[k : k + size]) for k in range(0, len(ids), size)]

    def forget_payload(self, blob: str) -> None:
        """The blob (hex SHA-256) left the store: forget the update headers that name it."""
        for message_id, entry in list(self._entries.items()):
            if getattr(entry.message.body, "payload_sha256", b"").hex() == blob:
                self.forget(message_id)

    def shift(self) -> None:
        """Start a new window: the oldest window's unkept messages and expired history are forgotten."""
        self._tick += 1
        if len(self._windows) == self._windows.maxlen:
            for message_id in self._windows[-1]:
                if message_id not in self._history:
                    self._entries.pop(message_id, None)
        self._windows.appendleft([])
        floor = self._tick - self.history_windows
        while self._history:
            message_id, tick = next(iter(self._history.items()))
            if tick > floor:
                break
            del self._history[message_id]
            self._entries.pop(message_id, None)

    def forget_peer(self, peer: str) -> None:
        for entry in self._entries.values():
            entry.known_by.discard(peer)
