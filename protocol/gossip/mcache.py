"""Recently forwarded signed messages: answerable to IWANT for `windows` heartbeats, announced with
IHAVE for the newest `gossip_windows` of them. Pure; one window per heartbeat (`shift`).

Only messages this node *holds* enter the cache (for an update: its blob is stored here), so an IHAVE
is also a promise that the blob can be fetched from us. Each entry remembers which peers are known to
have the message (they sent it to us, or we sent it to them), so it is neither announced nor pushed
to them again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from protocol.errors import LocalProtocolError
from protocol.messages import Signed


@dataclass
class CacheEntry:
    message: Signed
    known_by: set[str] = field(default_factory=set)


class MessageCache:
    def __init__(self, windows: int, gossip_windows: int) -> None:
        if not 0 < gossip_windows <= windows:
            raise LocalProtocolError("need 0 < gossip_windows <= windows")
        self.gossip_windows = gossip_windows
        self._windows: deque[list[bytes]] = deque([[]], maxlen=windows)
        self._entries: dict[bytes, CacheEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, message_id: bytes) -> bool:
        return message_id in self._entries

    def put(self, message: Signed, known_by: set[str]) -> CacheEntry:
        """Add a held message (idempotent: a second put only merges `known_by`)."""
        entry = self._entries.get(message.message_id)
        if entry is None:
            entry = self._entries[message.message_id] = CacheEntry(message, set(known_by))
            self._windows[0].append(message.message_id)
        else:
            entry.known_by |= known_by
        return entry

    def get(self, message_id: bytes) -> CacheEntry | None:
        return self._entries.get(message_id)

    def gossip_ids(self) -> list[bytes]:
        """Ids to announce this heartbeat, newest first."""
        out: list[bytes] = []
        for i, window in enumerate(self._windows):
            if i >= self.gossip_windows:
                break
            out.extend(reversed(window))
        return out

    def shift(self) -> None:
        """Start a new window; the oldest window's messages are forgotten."""
        if len(self._windows) == self._windows.maxlen:
            for message_id in self._windows[-1]:
                self._entries.pop(message_id, None)
        self._windows.appendleft([])

    def forget_peer(self, peer: str) -> None:
        for entry in self._entries.values():
            entry.known_by.discard(peer)
