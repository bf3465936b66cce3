"""Serving this node's state to joiners and repairs (PROTOCOL.md, "State sync").

`GET /state` answers the canonical bytes of this node's latest signed `StateManifest`, whose one blob,
`meta`, is the state's `protocol.ledger.statesync.StateMeta` (a few bytes per update, with the bottom's
piece index): served by `GET /blobs/<sha256>` like any blob. The window bottom is served piece by piece,
`GET /state/bottom/<bottom digest hex>/<piece index>`, from a file the bottom is *frozen* into when a
manifest is built (the live bottom moves when a slot leaves the window): one file per bottom digest, so
every manifest of the same bottom shares it, and the bottom is written once per slot that leaves the
window, not once per manifest; its piece index is the ledger's (hashed once, for the bottom digest). The window's payloads are blobs: an entry's
payload bytes are put into the blob store (content-addressed: the blob gossip delivered, when the node
holds it, costs one hash per update), an entry kept without a payload as an `fp32` payload (exact).

Bounds: the last `KEEP_SNAPSHOTS` meta blobs and `KEEP_BOTTOMS` frozen bottoms are kept, so a download
in progress survives the next manifests; payload blobs this server added to the store are removed once
no kept meta lists them. Files left by a previous process are removed at start. The manifest is made on
demand, at most once per ledger change; 503 while this node has no state.

Piece answers: 200 with the piece's bytes; 400 for a malformed path; 404 for a bottom not (or no
longer) frozen here or a piece index past its end. Thread-safety: everything runs on the trio thread
under one lock, file I/O and hashing in worker threads.
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trio

from node.outer.replica import Replica
from p2p import Host, Kind, Request, Response, blob_hex
from p2p.blobserve import client_name
from protocol.compression import Codec, encode_tensors
from protocol.errors import LocalProtocolError
from protocol.ledger import SnapshotEntry
from protocol.ledger.digest import state_digest
from protocol.ledger.statesync import BOTTOM_PREFIX, META_BLOB, BottomIndex, Piece, StateMeta
from protocol.wire import encode

__all__ = ["BOTTOM_PREFIX", "KEEP_BOTTOMS", "KEEP_SNAPSHOTS", "META_BLOB", "STATE_PATH", "FrozenBottoms",
           "StateServer"]

log = logging.getLogger("node.state")

STATE_PATH = "/state"
MANIFEST_TYPE = "application/x-diloco-manifest"
KEEP_SNAPSHOTS = 6  # meta blobs kept for downloads in progress (repairs ask every round after a fork)
KEEP_BOTTOMS = 3  # frozen bottoms kept (each one model-sized on disk)
_HEX64 = re.compile(r"[0-9a-f]{64}")
_INDEX = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True)
class _Frozen:
    path: Path
    index: BottomIndex
    pieces: tuple[Piece, ...]


class FrozenBottoms:
    """Frozen window bottoms, `<directory>/<bottom digest hex>.bottom`, newest last. Blocking methods
    (`freeze`, `read_piece`) run in worker threads; the others are cheap."""

    def __init__(self, directory: Path, keep: int = KEEP_BOTTOMS) -> None:
        self.directory = directory
        self.keep = keep
        self._frozen: OrderedDict[str, _Frozen] = OrderedDict()
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.iterdir():  # a previous process's: their indexes are gone with it
            stale.unlink(missing_ok=True)

    def has(self, digest: bytes) -> bool:
        return digest.hex() in self._frozen

    def index(self, digest: bytes) -> BottomIndex:
        return self._frozen[digest.hex()].index

    def freeze(self, index: BottomIndex, arrays: Mapping[str, np.ndarray]) -> None:
        """Write `arrays` (the bottom `index` describes) to its file, in the index's layout (blocking)."""
        name = index.digest().hex()
        path = self.directory / f"{name}.bottom"
        part = path.with_suffix(".tmp")
        try:
            with open(part, "wb") as f:
                for a in index.arrays:
                    data = np.ascontiguousarray(arrays[a.name], dtype=np.dtype(a.dtype))
                    f.write(memoryview(data).cast("B"))
        except OSError:  # a full disk: nothing half-written stays
            part.unlink(missing_ok=True)
            raise
        os.replace(part, path)
        self._frozen[name] = _Frozen(path, index, tuple(index.pieces()))

    def prune(self) -> None:
        """Keep the newest `keep` bottoms (an older one's file goes; a piece read in flight still ends)."""
        while len(self._frozen) > self.keep:
            _, old = self._frozen.popitem(last=False)
            old.path.unlink(missing_ok=True)

    def touch(self, digest: bytes) -> None:
        self._frozen.move_to_end(digest.hex())

    def piece(self, name: str, i: int) -> tuple[Path, Piece] | None:
        frozen = self._frozen.get(name)
        if frozen is None or not 0 <= i < len(frozen.pieces):
            return None
        return frozen.path, frozen.pieces[i]


def _read_piece(path: Path, piece: Piece) -> bytes | None:
    try:
        with open(path, "rb", buffering=0) as f:
            data = os.pread(f.fileno(), piece.length, piece.offset)
    except FileNotFoundError:
        return None
    return data if len(data) == piece.length else None


class StateServer:
    """Answers `GET /state` and `GET /state/bottom/...` for one node (see the module docstring)."""

    def __init__(self, host: Host, directory: Path | None = None) -> None:
        self.host = host
        self.replica: Replica | None = None  # set once this node has a state
        self.bottoms = FrozenBottoms(directory or Path(host.config.data_dir) / "state" / "served")
        self.pieces_served = 0  # bottom pieces answered (tests watch it)
        self._lock = trio.Lock()
        self._cached: tuple[int, bytes] | None = None  # (replica version, manifest bytes)
        self._metas: list[tuple[str, frozenset[str]]] = []  # (meta blob, payload blobs it lists), newest last
        self._payloads: dict[bytes, tuple[Codec, str, int]] = {}  # update id → its payload blob
        self._added: set[str] = set()  # payload blobs this server put into the store
        self._disk_error: str | None = None  # the last state that could not be written (logged once)

    def serve(self, replica: Replica) -> None:
        """Serve `replica`'s state from now on (the next `GET /state` builds its manifest)."""
        self.replica, self._cached = replica, None

    def mount(self) -> None:
        self.host.http.route("GET", STATE_PATH, self.handle, per_client="20/second")
        self.host.http.route("GET", BOTTOM_PREFIX, self.handle_piece)

    async def handle(self, request: Request) -> Response:
        if request.path != STATE_PATH:
            return Response.text(404, "not found\n")
        if self.replica is None:
            return Response.text(503, "no state yet (syncing)\n")
        try:
            manifest = await self.manifest_bytes()
        except LocalProtocolError as exc:  # a bug on this side: logged, the node goes on
            log.error("cannot serve this node's state: %s", exc)
            return Response.text(500, "cannot serve this node's state\n")
        except OSError as exc:  # its bottom or meta cannot be written (a full disk): other donors serve
            log.log(logging.WARNING if self._disk_error is None else logging.DEBUG,
                    "cannot serve this node's state while its disk is full: %s", exc)
            self._disk_error = str(exc)
            return Response.text(503, "this node cannot serve its state now: its disk is full\n")
        self._disk_error = None
        return Response(200, manifest, {"content-type": MANIFEST_TYPE})

    async def handle_piece(self, request: Request) -> Response:
        parts = request.path.removeprefix(BOTTOM_PREFIX).split("/")
        if len(parts) != 2 or not _HEX64.fullmatch(parts[0]) or not _INDEX.fullmatch(parts[1]):
            return Response.text(400, "expected /state/bottom/<64 hex digits>/<piece index>\n")
        found = self.bottoms.piece(parts[0], int(parts[1]))
        data = None if found is None else await trio.to_thread.run_sync(_read_piece, *found)
        if data is None:
            return Response.text(404, "no such bottom or piece here\n")
        self.host.counters.sent(client_name(request, lambda peer: peer in self.host.connected_peers()), Kind.BLOB, len(data), frames=0)
        self.pieces_served += 1
        return Response(200, data, {"content-type": "application/octet-stream"})

    async def manifest_bytes(self) -> bytes:
        replica = self.replica
        assert replica is not None
        async with self._lock:
            version = replica.version
            if self._cached is not None and self._cached[0] == version and self.host.holds_blob(self._metas[-1][0]):
                return self._cached[1]
            served = await replica.served_state(self.bottoms.has)
            if served.bottom is not None:
                await self._freeze(served.bottom, BottomIndex.of_rows(served.bottom_rows), served.bottom_digest)
            self.bottoms.touch(served.bottom_digest)
            index = self.bottoms.index(served.bottom_digest)
            if state_digest(index.digest(), served.ledger_digest) != served.params_digest:
                raise LocalProtocolError("the frozen bottom does not give this replica's params digest")
            snap = served.snapshot
            blobs = {e.meta.update_id: await self._payload_blob(e) for e in snap.entries}
            meta = StateMeta.of_snapshot(snap, blobs, index, replica.proofs)  # peers check every entry's signature
            data = await trio.to_thread.run_sync(meta.to_bytes)
            name = await self.host.add_blob(data)
            signed = await self.host.publish_manifest(snap.slot, served.ledger_digest, served.params_digest,
                                                      [(META_BLOB, name)])
            self._keep(name, frozenset(b for _, b, _ in blobs.values()))
            self.bottoms.prune()
            self._cached = (version, encode(signed))
            log.info("serving state of slot %d (ledger %s; meta %d bytes, bottom %s: %d pieces, %d payloads)",
                     snap.slot, served.ledger_digest.hex()[:16], len(data), served.bottom_digest.hex()[:16],
                     len(index.pieces()), len(blobs))
            return self._cached[1]

    async def _freeze(self, bottom: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], index: BottomIndex,
                      digest: bytes) -> None:
        """Write the bottom of a new state (once per bottom digest). Its piece index is the ledger's own
        (`Ledger.bottom_rows`, hashed once when the bottom moved), not hashed again here."""
        params, momentum = bottom
        arrays = {**{"theta/" + n: a for n, a in params.items()}, **{"momentum/" + n: a for n, a in momentum.items()}}
        if index.digest() != digest:
            raise LocalProtocolError("the bottom's piece index does not give the ledger's bottom digest")
        await trio.to_thread.run_sync(self.bottoms.freeze, index, arrays)

    async def _payload_blob(self, entry: SnapshotEntry) -> tuple[Codec, str, int]:
        """(codec, blob, size) of an entry's payload, put into the store if not there (cached per id)."""
        known = self._payloads.get(entry.meta.update_id)
        if known is not None and self.host.holds_blob(known[1]):
            return known
        if entry.payload is not None:
            codec, data = entry.payload.codec, entry.payload.data
        else:  # an update added without its payload: its float32 deltas, exactly
            codec = Codec.FP32
            data = await trio.to_thread.run_sync(encode_tensors, dict(entry.deltas), Codec.FP32)
        name = await trio.to_thread.run_sync(blob_hex, data)
        if not self.host.holds_blob(name):
            await self.host.add_blob(data)
            self._added.add(name)
        self._payloads[entry.meta.update_id] = (codec, name, len(data))
        return self._payloads[entry.meta.update_id]

    def _keep(self, meta_blob: str, payloads: frozenset[str]) -> None:
        """Record a new meta; drop the oldest beyond `KEEP_SNAPSHOTS` and the payload blobs this server
        added that no kept meta lists any more."""
        self._metas = [m for m in self._metas if m[0] != meta_blob] + [(meta_blob, payloads)]
        while len(self._metas) > KEEP_SNAPSHOTS:
            old, _ = self._metas.pop(0)
            self._forget(old)
        listed = frozenset().union(*(p for _, p in self._metas))
        for blob in sorted(self._added - listed):
            self._added.discard(blob)
            self._forget(blob)
        self._payloads = {i: ref for i, ref in self._payloads.items() if ref[1] in listed}

    def _forget(self, blob: str) -> None:
        self.host.remove_blob(blob)
