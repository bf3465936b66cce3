"""Serving blobs over HTTP: `GET /blobs/<hex>` streams a verified blob from the store.

Contract: only complete, verified blobs are served (the store never exposes part files); a blob not
in the store (never there, or removed) is a 404, and one removed while it is sent is sent whole (the
file is opened before the answer and read from the open file); the body
is read from disk with `os.pread` in `chunk_bytes` pieces in a worker thread, so a large blob is never
held whole in memory and the trio loop never blocks on the disk; `p2p.http` reads the next piece
while hypercorn sends this one. Each piece is a fresh `bytes` (hypercorn passes `bytes` bodies to the
socket without copying; a reused `bytearray` would be copied once more). A client may name itself
with the `x-diloco-peer` header; that name is used for the byte counters only (it is not
authenticated, and need not be: the content is verified by hash). The service remembers which named
peers received each of the last `RECENT_SERVES` blobs whole (`served_to`, `wait_served`): a node that
publishes the round it was stopped in waits, bounded, until its peers hold the payload before it leaves.

`Range: bytes=START-END` (or `START-`, one range) is answered `206 Partial Content` with those bytes and a
`Content-Range`, so that a client can fetch one blob in pieces over several connections and from several
holders (`p2p.blobfetch.BlobClient.fetch_ranges`); a range past the end is `416`, any other form of the
header is ignored (the whole blob, 200). A peer counts as having received a blob whole once the ranges it
was sent add up to its size.
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable

import trio

from p2p.blobstore import BlobStore, check_hex
from p2p.counters import UNKNOWN_PEER, Counters, Kind
from p2p.http import HttpApp, Request, Response
from protocol.errors import LocalProtocolError

log = logging.getLogger("p2p.blobs")

BLOB_PREFIX = "/blobs/"
PEER_HEADER = "x-diloco-peer"
DEFAULT_CHUNK = 4 << 20
RECENT_SERVES = 64  # blobs whose complete serves are remembered, per named peer
_PEER_NAME = re.compile(r"[1-9A-HJ-NP-Za-km-z]{1,64}")  # base58: safe as a metrics label
_RANGE = re.compile(r"bytes=(\d{1,19})-(\d{0,19})")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """The byte range [start, end) a `Range` header asks of a blob of `size` bytes; None for the whole blob
    (no header, or one not of the form `bytes=START-[END]`, which is ignored); "unsatisfiable" for a range
    that starts past the end."""
    m = _RANGE.fullmatch(header.strip()) if header else None
    if m is None:
        return None
    start = int(m[1])
    end = size if not m[2] else min(size, int(m[2]) + 1)
    if start >= size or end <= start:
        return "unsatisfiable"
    return start, end


def client_name(request: Request, known: Callable[[str], bool] = lambda peer: True) -> str:
    """The peer a client names itself in `x-diloco-peer` (for byte counters only), or `unknown`. The header is
    not authenticated: a name is used only if `known(name)` (the host passes its peer table), so a client
    cannot mint counter keys and metric labels without bound."""
    peer = request.headers.get(PEER_HEADER, "")
    return peer if _PEER_NAME.fullmatch(peer) and known(peer) else UNKNOWN_PEER


class BlobService:
    """The `/blobs/` route of a node's HTTP app."""

    def __init__(self, store: BlobStore, counters: Counters, *, chunk_bytes: int = DEFAULT_CHUNK,
                 known: Callable[[str], bool] = lambda peer: True) -> None:
        self.store = store
        self.counters = counters
        self.chunk_bytes = chunk_bytes
        self.known = known  # which `x-diloco-peer` names count under their own name (`client_name`)
        self._served: OrderedDict[str, set[str]] = OrderedDict()  # blob -> peers that received it whole
        self._partial: OrderedDict[tuple[str, str], int] = OrderedDict()  # (blob, peer) -> bytes sent in ranges
        self._served_one = trio.Event()  # set (and replaced) at every complete serve

    def served_to(self, name: str) -> frozenset[str]:
        """The named peers that received blob `name` whole from us (of the last `RECENT_SERVES` blobs served)."""
        return frozenset(self._served.get(name, ()))

    async def wait_served(self, name: str, peers: Callable[[], set[str]], recheck_s: float = 1.0) -> None:
        """Return once every peer in `peers()` (asked again at each serve, and every `recheck_s`: peers come
        and go) has received blob `name` whole from us. Unbounded: the caller cancels it."""
        while not peers() <= self.served_to(name):
            with trio.move_on_after(recheck_s):
                await self._served_one.wait()

    def _record_serve(self, name: str, peer: str) -> None:
        self._served.setdefault(name, set()).add(peer)
        self._served.move_to_end(name)
        while len(self._served) > RECENT_SERVES:
            self._served.popitem(last=False)
        self._served_one.set()
        self._served_one = trio.Event()

    def mount(self, app: HttpApp) -> None:
        app.route("GET", BLOB_PREFIX, self.handle)

    async def handle(self, request: Request) -> Response:
        name = request.path.removeprefix(BLOB_PREFIX)
        try:
            check_hex(name)
        except LocalProtocolError:
            return Response.text(400, "bad blob name\n")
        peer = client_name(request, self.known)
        try:
            size = self.store.size(name)
            # Opened before answering: a blob removed meanwhile (an old snapshot) is a clean 404, and one
            # removed while it is being sent is still read to the end (the open file outlives the unlink).
            file = open(self.store.path(name), "rb", buffering=0)  # noqa: SIM115 - closed by _stream (or GC)
        except (KeyError, FileNotFoundError):
            return Response.text(404, "no such blob\n")
        wanted = parse_range(request.headers.get("range"), size)
        headers = {"content-type": "application/octet-stream", "accept-ranges": "bytes"}
        if wanted == "unsatisfiable":
            file.close()
            return Response(416, b"range not satisfiable\n", {**headers, "content-range": f"bytes */{size}"})
        if wanted is None:
            return Response(200, self._stream(file, name, size, peer, 0, size), headers, content_length=size)
        start, end = wanted
        return Response(206, self._stream(file, name, size, peer, start, end),
                        {**headers, "content-range": f"bytes {start}-{end - 1}/{size}"}, content_length=end - start)

    async def _stream(self, file: io.FileIO, name: str, size: int, peer: str, start: int,
                      end: int) -> AsyncIterator[bytes]:
        at = start
        try:
            fd = file.fileno()
            while at < end:
                chunk = await trio.to_thread.run_sync(os.pread, fd, min(self.chunk_bytes, end - at), at)
                if not chunk:
                    break  # the file shrank under us; the client sees a short body
                at += len(chunk)
                yield chunk
                self.counters.sent(peer, Kind.BLOB, len(chunk), frames=0)
        finally:
            file.close()
            if at == end and self._add_served(name, peer, end - start, size):
                self.counters.blobs_served += 1
                self._record_serve(name, peer)
                self.counters.traffic(peer, Kind.BLOB).sent_frames += 1
            log.debug("served blob %s to %s: %d of bytes %d-%d of %d", name[:12], peer[:16], at - start, start,
                      end, size)

    def _add_served(self, name: str, peer: str, sent: int, size: int) -> bool:
        """Count `sent` bytes of blob `name` served whole to `peer` in a range; True once they add up to it."""
        if sent >= size:
            return True
        key = (name, peer)
        got = self._partial.pop(key, 0) + sent
        if got >= size:
            return True
        self._partial[key] = got
        while len(self._partial) > RECENT_SERVES * 8:
            self._partial.popitem(last=False)
        return False
