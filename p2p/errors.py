"""The p2p layer's one domain exception for I/O failures.

Every OSError, trio.BrokenResourceError, trio.ClosedResourceError and httpx.TransportError raised by a
socket or an HTTP exchange is re-raised as `TransportError` at the edge of this package; a peer that
*misbehaved* raises `protocol.errors.RemoteProtocolError` instead (it carries a `Reason` to count).
"""

from __future__ import annotations

import trio


class TransportError(Exception):
    """A connection or HTTP exchange failed (refused, reset, closed, timed out, bad HTTP status)."""

    def __init__(self, message: str, *, peer: str = "") -> None:
        self.peer = peer
        super().__init__(f"{peer[:16]}: {message}" if peer else message)


class LinkBroken(TransportError, trio.BrokenResourceError):
    """A TLS link failed (`p2p.tls`): our `TransportError`, and the `trio.BrokenResourceError` that code written
    for trio streams (hypercorn's connection handler) expects of a broken stream."""


class LocalStoreError(TransportError):
    """A fetched blob could not be written here (a full disk): the holder did nothing wrong."""


class BlobGone(TransportError):
    """A holder answered 404 for a blob: it does not hold it (any more: its clean-up removed it). Asking it
    again will not help, unlike a holder that could not be reached."""


class AddressError(Exception):
    """This node's own address cannot be used: it cannot listen on it, or cannot tell peers how to reach
    it. `what` names the address: "gossip" (the listen address), "http" or "advertise"."""

    def __init__(self, what: str, message: str) -> None:
        self.what = what
        super().__init__(message)
