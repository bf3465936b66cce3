"""Downloading a peer state in verified pieces from several donors at once (PROTOCOL.md, "State sync").

`download_state(host, manifests, ...)` loads the state that `manifests` (one per donor, all of the same
slot, ledger digest and params digest) describe:

1. the **meta** blob from one donor, the next one if it cannot be fetched, decoded or verified
   (`protocol.ledger.statesync.verify_meta`: its bottom index and ledger digest give the signed params
   digest, so from here on every piece is checked by its hash alone);
2. the **bottom** from *every* donor in parallel (`fetch_bottom`: `PER_DONOR` pieces in flight per donor),
   each piece checked against its hash, then written at its offset into a part file named by the bottom
   digest (`BottomDownload`). A donor that fails (unreachable, an HTTP error, a stall) is dropped for this
   download and its in-flight pieces go back to the queue for the others; one that sends a piece of the
   wrong length or hash is refused the same way and counted (`Reason.BAD_CHUNK`). Verified pieces stay
   in the part file: a retry for the same bottom (the same or a later manifest of it) rehashes the file
   and fetches only the pieces that do not match;
3. the window's **payload** blobs (`Host.fetch_blob`) from any donor or connected peer, verified by the
   blob client; blobs the node already holds (gossip delivered them) are not fetched;
4. the ledger, from the meta, memory-mapped views of the bottom file and memory-mapped payloads: nothing
   model-sized is read into memory here beyond what `Ledger.from_snapshot` keeps. Its ledger and params
   digests must be the manifest's (`bad_state` if not). The bottom file is removed afterwards (the
   ledger copied the bottom into its store), and so are the meta blobs; the payload blobs fetched are
   handed to the caller's blob clean-up (the ledger maps them, and peers may fetch them from us).

Errors: `TransportError` when no donor served what was needed (the verified pieces are kept for a retry),
`RemoteProtocolError` for a state that does not verify (counted against the donor of the meta).
Hashing, file writes and loading run in worker threads; the trio loop only moves bytes.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import trio

from node.outer.outer_files import drop_pages, map_blob
from p2p import Host, Kind, TransportError
from p2p.blobserve import PEER_HEADER
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import BottomStore, Ledger, LedgerConfig, SnapshotEntry
from protocol.ledger.bound import check_origin_places
from protocol.ledger.payload import decode_snapshot_payload
from protocol.ledger.proof import UpdateProof, check_entry
from protocol.ledger.statesync import (BOTTOM_PREFIX, META_BLOB, BottomIndex, MetaEntry, Piece, StateMeta,
                                      verify_meta)
from protocol.messages import StateManifest
from protocol.parallel import parallel_map

__all__ = ["PER_DONOR", "BottomDownload", "Donor", "Loaded", "download_state", "fetch_bottom", "fetch_meta",
           "fetch_payloads", "forget", "load"]

log = logging.getLogger("node.state")

PER_DONOR = 2  # bottom pieces in flight per donor (each ≤ 4 MiB in memory while it is checked)
PARALLEL_PAYLOADS = 4
MAX_META_BYTES = 1 << 30
_FINITE_CHUNK = 1 << 20  # elements checked at once (bounds the temporary)

PieceHook = Callable[[str, int], None]


@dataclass(frozen=True)
class Donor:
    peer: str
    http_addr: str


#: Part files of the downloads running in this process: a join and repairs with several peers may fetch
#: at once, even the same bottom; none may take or delete another's file.
_IN_USE: set[Path] = set()


class BottomDownload:
    """The bottom `index` describes, downloaded into `<directory>/<bottom digest hex>.part` (`….<n>.part`
    while another download of this process uses that one). Blocking methods run in worker threads; `done`
    is read and written on the trio thread; `release` when done with it, whatever happened."""

    def __init__(self, index: BottomIndex, directory: Path) -> None:
        self.index = index
        self.pieces = index.pieces()
        self.name = index.digest().hex()
        self.directory = directory
        self.path, n = directory / f"{self.name}.part", 0
        while self.path in _IN_USE:
            n += 1
            self.path = directory / f"{self.name}.{n}.part"
        _IN_USE.add(self.path)
        self.done: set[int] = set()
        self.resumed = 0  # pieces found verified in a part file left by an earlier attempt

    def open(self) -> None:
        """Create the part file, or keep the one of an earlier attempt and every piece of it that
        still matches its hash (rehashed in parallel threads: nothing on disk is trusted)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size == self.index.nbytes:
            with open(self.path, "rb", buffering=0) as f:
                fd = f.fileno()
                ok = parallel_map(lambda p: _matches(os.pread(fd, p.length, p.offset), p), self.pieces)
            self.done = {p.index for p, good in zip(self.pieces, ok, strict=True) if good}
            self.resumed = len(self.done)
            return
        with open(self.path, "wb") as f:
            f.truncate(self.index.nbytes)  # sparse until written

    def write_verified(self, piece: Piece, data: bytes) -> bool:
        """Write `data` at the piece's offset if it is the piece (length and SHA-256); False if not."""
        if not _matches(data, piece):
            return False
        fd = os.open(self.path, os.O_WRONLY)
        try:
            os.pwrite(fd, data, piece.offset)
        finally:
            os.close(fd)
        return True

    @property
    def missing(self) -> list[int]:
        return [p.index for p in self.pieces if p.index not in self.done]

    def views(self) -> dict[str, np.ndarray]:
        """The downloaded arrays, memory-mapped read-only (call once every piece is done)."""
        if self.index.nbytes == 0:
            return self.index.views(b"")
        return self.index.views(np.memmap(self.path, dtype=np.uint8, mode="r"))

    def remove(self) -> None:
        """Delete the finished file, and the part files of other bottoms no download uses (attempts the
        state moved past)."""
        for stale in self.directory.glob("*.part"):
            if stale == self.path or stale not in _IN_USE:
                stale.unlink(missing_ok=True)

    def release(self) -> None:
        _IN_USE.discard(self.path)


def _matches(data: bytes, piece: Piece) -> bool:
    return len(data) == piece.length and hashlib.sha256(data).digest() == piece.sha256


class _Queue:
    """Which pieces wait, which are in flight; `changed` wakes idle workers."""

    def __init__(self, missing: list[int]) -> None:
        self.waiting = list(reversed(missing))  # pop() takes the lowest index first
        self.in_flight: set[int] = set()
        self.changed = trio.Event()

    def notify(self) -> None:
        self.changed.set()
        self.changed = trio.Event()


async def fetch_bottom(download: BottomDownload, donors: Sequence[Donor], host: Host, *,
                       per_donor: int = PER_DONOR, on_piece: PieceHook | None = None,
                       timeout_s: float = 30.0) -> None:
    """Fetch every missing piece of `download` from `donors` in parallel (module docstring). Returns once
    all pieces are verified and written; raises `TransportError` when every donor was dropped first, and
    `OSError` when the part file cannot be written (the verified pieces stay on disk either way)."""
    queue = _Queue(download.missing)
    dropped: dict[str, str] = {}
    local: list[OSError] = []  # a local file error ends the whole download
    url = {d.peer: f"{host.peer_url(d.http_addr)}{BOTTOM_PREFIX}{download.name}/" for d in donors}

    def drop(peer: str, why: str) -> None:
        if peer not in dropped:
            dropped[peer] = why
            log.info("bottom %s: dropped donor %s for this download: %s", download.name[:12], peer, why)
        queue.notify()

    async def worker(client: httpx.AsyncClient, peer: str) -> None:
        while peer not in dropped:
            if not queue.waiting:
                if not queue.in_flight:
                    return
                await queue.changed.wait()
                continue
            i = queue.waiting.pop()
            queue.in_flight.add(i)
            try:
                ok, why = await _one_piece(client, download, download.pieces[i], url[peer] + str(i), host, peer)
            except OSError as exc:  # the part file (disk full, removed): no donor can help
                local.append(exc)
                nursery.cancel_scope.cancel()
                return
            except BaseException:
                queue.waiting.append(i)
                raise
            finally:
                queue.in_flight.discard(i)
            if ok:
                download.done.add(i)
                if on_piece is not None:
                    on_piece(peer, i)
            else:
                queue.waiting.append(i)
                drop(peer, why)
            queue.notify()

    headers = {PEER_HEADER: host.peer_id}
    async with host.http_client(httpx.Timeout(timeout_s, connect=5.0), headers=headers) as client:
        async with trio.open_nursery() as nursery:
            for donor in donors:
                for _ in range(per_donor):
                    nursery.start_soon(worker, client, donor.peer)
    if local:
        raise local[0]
    if queue.waiting:
        raise TransportError(f"bottom {download.name[:12]}: {len(download.done)} of {len(download.pieces)} pieces "
                             f"verified, no donor left ({'; '.join(f'{p}: {w}' for p, w in dropped.items())})")


async def _one_piece(client: httpx.AsyncClient, download: BottomDownload, piece: Piece, url: str, host: Host,
                     peer: str) -> tuple[bool, str]:
    """Fetch, check and write one piece: (True, "") or (False, why the donor is dropped)."""
    data = bytearray()
    try:
        async with client.stream("GET", url) as response:
            if response.status_code != 200:
                return False, f"piece {piece.index}: HTTP {response.status_code}"
            async for chunk in response.aiter_raw():
                data += chunk
                if len(data) > piece.length:
                    break
    except httpx.HTTPError as exc:
        return False, f"piece {piece.index}: {type(exc).__name__}: {exc}"
    host.counters.received(peer, Kind.BLOB, len(data), frames=0)
    if await trio.to_thread.run_sync(download.write_verified, piece, bytes(data)):
        return True, ""
    host.counters.rejected(peer, Reason.BAD_CHUNK)
    log.warning("refused bottom piece %d of %s from %s (%s): %d bytes, not the indexed %d bytes of SHA-256 %s",
                piece.index, download.name[:12], peer, Reason.BAD_CHUNK.value, len(data), piece.length,
                piece.sha256.hex()[:16])
    return False, f"piece {piece.index}: {Reason.BAD_CHUNK.value}"


async def fetch_meta(host: Host, manifest: StateManifest, config: LedgerConfig,
                     shapes: Mapping[str, tuple[int, ...]]) -> StateMeta:
    """The verified meta of `manifest`, from its origin: decoded, made for this model and config, the
    signed state (`verify_meta`), and every entry an update its origin signed (`check_entry`) that this
    node's gossip accept hook takes (its claim, its origin's admission). Raises TransportError (not
    served), RemoteProtocolError (refused: the caller counts it against the origin)."""
    refs = {name: (sha.hex(), size) for name, sha, size in manifest.blobs}
    if META_BLOB not in refs:
        raise TransportError(f"the manifest of {manifest.origin} lists no {META_BLOB!r} blob (an older node?)")
    blob, size = refs[META_BLOB]
    if size > MAX_META_BYTES:
        raise RemoteProtocolError(Reason.OVERSIZED, f"meta of {size} bytes")
    had = host.holds_blob(blob)
    try:
        with host.kept_blobs([blob]):
            path = await host.fetch_blob(blob, size, [manifest.origin])
            data = await trio.to_thread.run_sync(path.read_bytes)
    except OSError as exc:
        raise TransportError(f"meta {blob[:12]}: {exc}", peer=manifest.origin) from exc
    finally:
        if not had:
            host.remove_blob(blob)

    def check() -> StateMeta:
        meta = StateMeta.from_bytes(data)
        if dict(meta.config) != config.fingerprint():
            raise RemoteProtocolError(Reason.BAD_STATE, f"config differs: {dict(meta.config)}")
        if dict(meta.shapes) != {n: tuple(s) for n, s in sorted(shapes.items())}:
            raise RemoteProtocolError(Reason.BAD_STATE, "tensor names or shapes differ from the local model")
        verify_meta(meta, manifest.slot, manifest.ledger_digest, manifest.params_digest)
        check_origin_places(((e.slot, e.meta) for e in meta.entries), config.max_updates_per_origin)
        for entry in meta.entries:  # every entry as its origin signed it, and as this node would accept it
            signed = check_entry(host.config.run_id, entry.meta, entry.codec, entry.blob, entry.size, meta.shapes,
                                 entry.proof)
            host.check_accepted(signed)
        return meta

    return await trio.to_thread.run_sync(check)


async def fetch_payloads(host: Host, entries: Sequence[MetaEntry], peers: Sequence[str]) -> tuple[dict[str, Path],
                                                                                                  set[str]]:
    """The payload blobs of `entries` (fetched from `peers`, each entry starting at another one, unless
    held already): (blob → path, the blobs fetched here). Raises TransportError when one could not be
    fetched (the ones fetched are removed again)."""
    paths: dict[str, Path] = {}
    fetched: set[str] = set()
    failures: list[str] = []
    limit = trio.Semaphore(PARALLEL_PAYLOADS)
    blobs = {e.blob: e.size for e in entries}

    async def one(k: int, blob: str, size: int) -> None:
        async with limit:
            had = host.holds_blob(blob)
            order = [*peers[k % len(peers):], *peers[:k % len(peers)]] if peers else []
            try:
                paths[blob] = await host.fetch_blob(blob, size, order)
            except TransportError as exc:
                failures.append(str(exc))
                return
            if not had:
                fetched.add(blob)

    async with trio.open_nursery() as nursery:
        for k, (blob, size) in enumerate(sorted(blobs.items())):
            nursery.start_soon(one, k, blob, size)
    if failures:
        forget(host, fetched)
        raise TransportError(f"{len(failures)} of {len(blobs)} payloads not fetched: {failures[0]}")
    return paths, fetched


def forget(host: Host, blobs: set[str]) -> None:
    """Remove blobs fetched for a download that failed (not one the gossip router now waits for)."""
    for blob in blobs:
        if not host.awaits_blob(blob):
            host.remove_blob(blob)


@dataclass(frozen=True)
class Loaded:
    """A loaded state; `fetched`: the payload blobs this download added to the store (the caller's blob
    clean-up owns them from here: the ledger maps them, other peers may fetch them)."""

    ledger: Ledger
    meta: StateMeta
    manifest: StateManifest  # the manifest whose origin served the meta
    fetched: frozenset[str]

    def proofs(self) -> dict[bytes, UpdateProof]:
        """Each entry's proof (all there and checked: `fetch_meta`)."""
        return {e.meta.update_id: e.proof for e in self.meta.entries if e.proof is not None}

    def fetched_payloads(self) -> list[tuple[int, str]]:
        """(target slot, blob) of each fetched payload, as the node's blob clean-up lists them."""
        return sorted({(e.meta.target_slot, e.blob) for e in self.meta.entries if e.blob in self.fetched})


def load(meta: StateMeta, download: BottomDownload, paths: Mapping[str, Path], manifest: StateManifest,
         config: LedgerConfig, shapes: Mapping[str, tuple[int, ...]], bottom: BottomStore | None) -> Ledger:
    """Build the ledger (blocking: run it in a worker thread) and check it against the manifest."""
    views = download.views()
    for name, a in views.items():
        flat = a.reshape(-1)
        for at in range(0, flat.size, _FINITE_CHUNK):
            if not np.isfinite(flat[at : at + _FINITE_CHUNK]).all():
                raise RemoteProtocolError(Reason.BAD_STATE, f"bottom array {name} has non-finite values")
        drop_pages(a)
    entries = []
    for e in meta.entries:
        data = map_blob(paths[e.blob])
        payload, deltas = decode_snapshot_payload(str(e.codec), data, meta.shapes)
        drop_pages(data)
        entries.append(SnapshotEntry(e.meta, e.slot, deltas, payload))
    params = {n[len("theta/"):]: a for n, a in views.items() if n.startswith("theta/")}
    momentum = {n[len("momentum/"):]: a for n, a in views.items() if n.startswith("momentum/")}
    ledger = Ledger.from_snapshot(meta.snapshot(params, momentum, tuple(entries)), config, shapes, bottom=bottom)
    if ledger.ledger_digest() != manifest.ledger_digest or ledger.params_digest() != manifest.params_digest:
        raise RemoteProtocolError(Reason.BAD_STATE, "loaded state does not match the manifest's digests")
    return ledger


async def download_state(host: Host, manifests: Sequence[StateManifest], config: LedgerConfig,
                         shapes: Mapping[str, tuple[int, ...]], bottom: BottomStore | None, *,
                         directory: Path | None = None, on_piece: PieceHook | None = None,
                         per_donor: int = PER_DONOR) -> Loaded:
    """Download, verify and load the state of `manifests` (module docstring). `directory` holds the
    part files (default: `<data dir>/state/download`); `on_piece(peer, index)` hears of each verified
    piece (progress, tests)."""
    directory = directory or Path(host.config.data_dir) / "state" / "download"
    addrs = {p.peer_id: p.http_addr for p in host.peers() if p.http_addr}
    donors = [Donor(m.origin, addrs[m.origin]) for m in manifests if m.origin in addrs]
    failures: list[str] = []
    for manifest in manifests:
        try:
            meta = await fetch_meta(host, manifest, config, shapes)
        except TransportError as exc:
            failures.append(f"{manifest.origin}: {exc}")
            continue
        except RemoteProtocolError as exc:
            host.counters.rejected(manifest.origin, exc.reason)
            log.warning("refused the state meta of %s: %s", manifest.origin, exc)
            failures.append(f"{manifest.origin}: {exc}")
            continue
        spill = host.store.directory_for(meta.bottom.nbytes)  # a full disk: in the blob store's spill (memory)
        download = BottomDownload(meta.bottom, directory if spill == host.store.directory else spill / "state")
        try:
            await trio.to_thread.run_sync(download.open)
            if download.resumed:
                log.info("bottom %s: %d of %d pieces kept from an earlier attempt", download.name[:12],
                         download.resumed, len(download.pieces))
            await fetch_bottom(download, donors, host, per_donor=per_donor, on_piece=on_piece)
            others = [p for p in host.connected_peers() if p not in {d.peer for d in donors}]
            with host.kept_blobs(e.blob for e in meta.entries):  # readable until `load` has mapped them
                paths, fetched = await fetch_payloads(host, meta.entries, [*(d.peer for d in donors), *others])
                try:
                    ledger = await trio.to_thread.run_sync(load, meta, download, paths, manifest, config, shapes,
                                                           bottom)
                except RemoteProtocolError as exc:
                    forget(host, fetched)
                    host.counters.rejected(manifest.origin, exc.reason)
                    log.warning("refused the state of %s: %s", manifest.origin, exc)
                    failures.append(f"{manifest.origin}: {exc}")
                    continue
            await trio.to_thread.run_sync(download.remove)
        except OSError as exc:  # the part file (a full disk): the next attempt goes to the spill, if it fits
            host.store.note_disk_error(exc)
            raise
        finally:
            download.release()
        log.info("loaded the state of slot %d: bottom of %d pieces (%d kept from an earlier attempt), %d payloads "
                 "(%d fetched)", meta.slot, len(download.pieces), download.resumed, len(meta.entries), len(fetched))
        return Loaded(ledger, meta, manifest, frozenset(fetched))
    raise TransportError(f"no donor served a usable state: {'; '.join(failures)}")
