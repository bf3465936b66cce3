"""Manifests the router delivered before it held their blobs: forwarded once it holds them all.

PROTOCOL.md section 10: a state manifest is delivered at once (a joiner fetches its blobs from the sender or
the origin), but a node forwards and announces one only while it holds every blob it lists, so it never
advertises what it cannot serve. The wait is bounded: past `limit` manifests the oldest is forgotten (it was
delivered; only its forwarding is lost).
"""

from __future__ import annotations

from collections.abc import Iterable

from protocol.messages import Signed

__all__ = ["WaitingManifests", "holds_blobs"]


def holds_blobs(manifest: Signed, local_blobs: set[str]) -> bool:
    """Whether every blob `manifest` lists is in `local_blobs` (hex SHA-256 names)."""
    return all(digest.hex() in local_blobs for _, digest, _ in manifest.body.blobs)


class WaitingManifests:
    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._waiting: dict[bytes, tuple[Signed, str]] = {}  # message id -> (manifest, the peer it came from)

    def add(self, manifest: Signed, sender: str) -> None:
        self._waiting[manifest.message_id] = (manifest, sender)
        while len(self._waiting) > self.limit:
            self._waiting.pop(next(iter(self._waiting)))

    def ready(self, local_blobs: set[str]) -> Iterable[tuple[Signed, str]]:
        """Take the manifests whose blobs are all held now, with their senders, oldest first."""
        for message_id, (manifest, sender) in list(self._waiting.items()):
            if holds_blobs(manifest, local_blobs):
                del self._waiting[message_id]
                yield manifest, sender

    def __len__(self) -> int:
        return len(self._waiting)
