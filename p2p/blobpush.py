"""Blobs that leave a node no one can dial: pushed over a connection it opens (PROTOCOL.md section 11).

A node behind a NAT (`p2p.reach` found no peer that could dial it back) cannot serve its own update's payload:
every fetch of it would fail. So before it publishes the header, it uploads the payload to peers it reached
itself: `PUT /blobs/<sha256 hex>` on their HTTP plane, over TLS with its certificate. Such a peer stores it
(verified against its name, as a fetched blob is), holds it from then on, and so the header that follows is
taken at once and forwarded, and every other peer fetches the blob from it.

Receiving side (`PushIntake`, mounted on the host's HTTP plane):
- only a connected peer may push (its TLS certificate's peer id, or, without TLS, the `x-diloco-peer`
  header), only blobs up to `max_bytes` with a Content-Length, and at most `max_unannounced` blobs no header
  has named yet per peer; a blob held already is answered 200 without a byte stored;
- a pushed blob that no delivered header names within `unannounced_s` seconds is removed (`sweep`), so a peer
  cannot fill the disk with blobs it never announces;
- bytes that do not hash to the name: 400 and nothing kept (`hash_mismatch`, counted against the pusher).

Pushing side: `push_blob(client, url, name, path, size)`: one streamed PUT; True once the peer holds it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from p2p.blobserve import BLOB_PREFIX, PEER_HEADER
from p2p.blobstore import BlobStore
from p2p.counters import Counters, Kind
from p2p.errors import TransportError
from p2p.http import HttpApp, Request, Response
from protocol.errors import Reason, RemoteProtocolError

log = logging.getLogger("p2p.blobpush")

_NAME = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20


@dataclass
class _Pushed:
    peer: str
    at: float


@dataclass
class PushIntake:
    """`PUT /blobs/<name>` of connected peers (module doc). `stored(name)` tells the router; `known(peer)`
    says whether `peer` is connected; `penalize(peer, reason, detail)` counts a pusher's bad bytes."""

    store: BlobStore
    counters: Counters
    known: Callable[[str], bool]
    stored: Callable[[str], None]
    penalize: Callable[[str, Reason, str], None]
    max_bytes: int = 1 << 30
    max_unannounced: int = 8
    unannounced_s: float = 600.0
    pending: dict[str, _Pushed] = field(default_factory=dict)  # pushed, not yet named by a delivered header

    def mount(self, app: HttpApp) -> None:
        app.route("PUT", BLOB_PREFIX, self.handle, per_client="20/second", stream_body=True)

    def announced(self, name: str) -> None:
        """A delivered header names `name`: it stays like any fetched blob."""
        self.pending.pop(name, None)

    def sweep(self, now: float) -> list[str]:
        """Remove pushed blobs no header named within `unannounced_s`; returns their names."""
        expired = [name for name, p in self.pending.items() if now - p.at > self.unannounced_s]
        for name in expired:
            del self.pending[name]
            self.store.remove(name)
        return expired

    async def handle(self, request: Request) -> Response:
        assert request.stream is not None
        peer = request.peer or request.headers.get(PEER_HEADER, "")
        name = request.path[len(BLOB_PREFIX):]
        length = request.headers.get("content-length", "")
        refusal = self._refusal(peer, name, length)
        if refusal is not None:
            return refusal
        if self.store.has(name):
            async for _ in request.stream:
                pass
            return Response.text(200, "held already\n")
        size = int(length)
        writer = self.store.open_writer(name, size)
        got = 0
        try:
            async for chunk in request.stream:
                got += len(chunk)
                if got > size:
                    raise RemoteProtocolError(Reason.OVERSIZED, f"more than the {size} bytes announced")
                await trio.to_thread.run_sync(writer.write, chunk)
            if got != size:
                raise RemoteProtocolError(Reason.TRUNCATED, f"{got} of {size} bytes")
            await trio.to_thread.run_sync(writer.commit)  # raises HASH_MISMATCH for bytes of another name
        except RemoteProtocolError as exc:
            self.penalize(peer, exc.reason, f"pushed blob {name[:12]}: {exc.detail}")
            return Response.text(400, f"refused: {exc.reason.value}: {exc.detail}\n")
        except (TransportError, OSError) as exc:
            log.info("push of blob %s from %s not stored: %s", name[:12], peer, exc)
            return Response.text(503, "not stored\n")
        finally:
            writer.close()
        self.counters.received(peer, Kind.BLOB, size, frames=0)
        self.pending[name] = _Pushed(peer, trio.current_time())
        log.info("stored blob %s (%d bytes) pushed by %s", name[:12], size, peer)
        self.stored(name)
        return Response.text(201, "stored\n")

    def _refusal(self, peer: str, name: str, length: str) -> Response | None:
        if not peer or not self.known(peer):
            return Response.text(403, "only a connected peer may push a blob\n")
        if not _NAME.fullmatch(name):
            return Response.text(400, "a blob's name is its SHA-256 in lowercase hex\n")
        if not length.isdigit() or not 0 < int(length) <= self.max_bytes:
            return Response.text(413, f"a pushed blob needs a Content-Length of at most {self.max_bytes} bytes\n")
        if sum(1 for p in self.pending.values() if p.peer == peer) >= self.max_unannounced:
            return Response.text(429, "too many pushed blobs no header has named yet\n")
        return None


async def _file_chunks(path: Path) -> AsyncIterator[bytes]:
    with open(path, "rb") as f:
        while chunk := await trio.to_thread.run_sync(f.read, CHUNK):
            yield chunk


async def push_to_peers(client: httpx.AsyncClient, targets: list[tuple[str, str]], name: str, path: Path, size: int,
                        *, copies: int = 2, timeout_s: float = 600.0) -> list[str]:
    """Push blob `name` to the first `copies` of `targets` ((peer, base URL), best first) that take it, trying
    the rest in turn; returns the peers that hold it now (empty: none took it)."""
    held: list[str] = []
    with trio.move_on_after(timeout_s):
        for peer, base in targets:
            if len(held) >= copies:
                break
            if await push_blob(client, f"{base}{BLOB_PREFIX}{name}", path, size):
                held.append(peer)
    return held


async def push_blob(client: httpx.AsyncClient, url: str, path: Path, size: int) -> bool:
    """PUT the blob at `path` (`size` bytes) to `url` (…/blobs/<name>); True once the peer holds it."""
    try:
        response = await client.put(url, content=_file_chunks(path), headers={"content-length": str(size)})
    except httpx.HTTPError as exc:
        log.info("push to %s failed: %s", url, exc)
        return False
    if response.status_code not in (200, 201):
        log.info("push to %s refused: %d %s", url, response.status_code, response.text.strip())
    return response.status_code in (200, 201)
