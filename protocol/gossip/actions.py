"""What the router asks its I/O layer to do. Frozen dataclasses; the router returns lists of them.

The I/O layer executes actions in order and reports outcomes back as router events
(`connected`, `dial_failed`, `blob_stored`, `fetch_failed`, ...). It never decides anything itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.errors import Reason
from protocol.messages import AnyMessage, Signed


@dataclass(frozen=True)
class Send:
    """Queue `message` on the connection to `peer` (dropped, and counted, if that queue is full). `conn`
    names the connection when `peer` is not (or no longer) in the router's table: a peer refused for room
    gets a last `peer_exchange` on it, which the I/O layer writes before the Disconnect that follows closes it."""

    peer: str
    message: AnyMessage
    conn: int | None = None


@dataclass(frozen=True)
class Fetch:
    """Download blob `blob` (hex SHA-256, `size` bytes) from `peer`'s HTTP plane, then report
    `blob_stored` or `fetch_failed`. At most one Fetch per blob is outstanding."""

    peer: str
    blob: str
    size: int


@dataclass(frozen=True)
class Deliver:
    """Hand a verified message to the application; for an update, `blob` is stored locally."""

    message: Signed
    blob: str | None
    source: str


@dataclass(frozen=True)
class Disconnect:
    """Close connection `conn` to `peer`. The router has already forgotten it."""

    peer: str
    conn: int
    reason: str


@dataclass(frozen=True)
class Dial:
    """Open a connection to `address`; `peer` is the id we expect there (None for a bootstrap
    address). Report `connected(..., dialed=address)` or `dial_failed(address)`."""

    address: str
    peer: str | None


@dataclass(frozen=True)
class Reject:
    """Something from `peer` was refused: count it by reason and log it (one line)."""

    peer: str
    reason: Reason
    detail: str


Action = Send | Fetch | Deliver | Disconnect | Dial | Reject
