"""The ledger's part of a node's checkpoint (`node.checkpoint`, version 3): what is written, and the restore
half of a restart.

A checkpoint holds the ledger the way the state plane moves it (PROTOCOL.md, "State sync"), not as one
snapshot: its `ledger` part is a small msgpack map (`encode_ledger_part`)

    {"format": "diloco-checkpoint-ledger", "version": 1,
     "state": the StateMeta encoding (slot, window, seen ids, counters, totals, each window entry's header
              with a reference (codec, SHA-256, size) to its payload blob, and the bottom's piece index),
     "norms": [[update id, [each tensor's norm, in sorted name order]], ...] (sorted by id)}

and its `outer` arrays are the window bottom (`bottom/theta/<name>`, `bottom/momentum/<name>`) and the
working state taken with it (`working/theta/<name>`, `working/momentum/<name>`). The payloads stay in the
node's blob store, where gossip put them (`payload_blob`; one held only in memory is put there): a checkpoint
costs 16 bytes per parameter of outer state instead of a copy of the window's payloads, and a restart
neither decodes nor copies them. The blob store keeps what the newest checkpoint refers to (`referenced_blobs`:
`node.outer.upkeep.HeldBlobs` pins them, `BlobStore.keep` spares their files whoever removes them, a restart
spares them).

Restore (`restore_ledger`): every referenced payload blob must be in the store with its size and SHA-256
(hashed on every core; a missing or damaged one makes the checkpoint unusable: `CheckpointError`), its
norms are the stored ones (nothing decoded), the ledger resumes from the working state (no replay), and
its digests must be the ones the state meta gives (the bottom arrays hashed against the piece index). A
version 1 or 2 checkpoint (one LedgerSnapshot, payloads inside) is decoded and its payloads moved into the
blob store, as before. Blocking: run it in a worker thread.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgpack
import numpy as np

from node.checkpoint import Checkpoint, CheckpointDir, CheckpointError
from node.outer.outer_files import map_blob, payload_blob, payloads_to_blobs
from p2p.blobstore import blob_hex
from protocol.compression import Codec, encode_tensors
from protocol.errors import RemoteProtocolError
from protocol.ledger import BottomStore, Ledger, LedgerConfig, LedgerSnapshot, Payload, PayloadDeltas, SnapshotEntry
from protocol.ledger.digest import Row, state_digest
from protocol.ledger.proof import UpdateProof
from protocol.ledger.statesync import BottomIndex, StateMeta
from protocol.parallel import parallel_map

__all__ = ["LedgerPart", "encode_ledger_part", "newest_checkpoint", "referenced_blobs", "restore_ledger"]

log = logging.getLogger("node.runtime")

FORMAT = "diloco-checkpoint-ledger"
VERSION = 1
_HASH_CHUNK = 4 << 20

Arrays = dict[str, np.ndarray]


class KeepingStore(Protocol):
    """What the ledger part needs of the node's blob store (`p2p.BlobStore`)."""

    def put(self, data: bytes | memoryview) -> str: ...

    def has(self, h: str) -> bool: ...

    def keep(self, names: Iterable[str]) -> None: ...

    def release(self, names: Iterable[str]) -> None: ...

    def path(self, h: str) -> Path: ...

    def size(self, h: str) -> int: ...


@dataclass(frozen=True)
class LedgerPart:
    """A checkpoint's ledger part, written (`encode_ledger_part`): its bytes, its `outer` arrays and the
    payload blobs it refers to (kept in the blob store until the caller releases them)."""

    data: bytes
    outer: Arrays
    blobs: frozenset[str]


def encode_ledger_part(snap: LedgerSnapshot, working: tuple[Arrays, Arrays], rows: Iterable[Row],
                       store: KeepingStore, proofs: Mapping[bytes, UpdateProof] | None = None) -> LedgerPart:
    """The ledger part of a checkpoint of `snap` (and the working state and bottom rows taken with it:
    `Replica.checkpoint_state`). A payload not in the blob store (held only in memory, an entry without one:
    its float32 deltas, as fp32, or mapped from a blob removed since) is put into `store` first. The part's
    blobs are kept in `store` (`BlobStore.keep`) for the caller, who releases them once a newer checkpoint
    has replaced this one (or this one was not written). Blocking."""
    blobs, norms = {}, []
    kept: set[str] = set()
    try:
        for e in sorted(snap.entries, key=lambda e: e.meta.update_id):
            if e.payload is not None:
                codec, data = e.payload.codec, e.payload.data
                name = _stored(store, data, payload_blob(e.payload), kept)
            else:
                codec, data = Codec.FP32, encode_tensors(dict(e.deltas), Codec.FP32)
                name = _stored(store, data, None, kept)
            blobs[e.meta.update_id] = (codec, name, len(data))
            # a ledger's entries keep the norms measured when they were checked; others are decoded once here
            measured = isinstance(e.deltas, PayloadDeltas) and e.deltas.norms is not None
            entry_norms = (e.deltas.norms if measured
                           else PayloadDeltas.validated(Payload(codec, data), snap.shapes).norms)
            norms.append([e.meta.update_id, [float(entry_norms[n]) for n in sorted(snap.shapes)]])
    except BaseException:
        store.release(kept)
        raise
    meta = StateMeta.of_snapshot(snap, blobs, BottomIndex.of_rows(rows), proofs)
    data = msgpack.packb({"format": FORMAT, "version": VERSION, "state": meta.to_bytes(), "norms": norms},
                         use_bin_type=True)
    theta, v = working
    outer = {**{"bottom/theta/" + n: a for n, a in snap.base_params.items()},
             **{"bottom/momentum/" + n: a for n, a in snap.base_momentum.items()},
             **{"working/theta/" + n: a for n, a in theta.items()},
             **{"working/momentum/" + n: a for n, a in v.items()}}
    return LedgerPart(data, outer, frozenset(kept))


def _stored(store: KeepingStore, data: bytes | memoryview, name: str | None, kept: set[str]) -> str:
    """The name of blob `data` (`name` if known), kept in `store` once (recorded in `kept`) and stored there
    (again, if it was removed since it was mapped)."""
    name = name or blob_hex(data)
    if name not in kept:
        store.keep([name])
        kept.add(name)
    if not store.has(name):
        store.put(data)
    return name


def _decode_part(ckpt: Checkpoint) -> tuple[StateMeta, dict[bytes, list[float]]]:
    try:
        doc = msgpack.unpackb(bytes(ckpt.ledger), raw=False)
    except (msgpack.UnpackException, ValueError, TypeError) as exc:
        raise CheckpointError(f"undecodable ledger part: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION \
            or set(doc) != {"format", "version", "state", "norms"} or not isinstance(doc["norms"], list):
        raise CheckpointError(f"the ledger part is not a {FORMAT} of version {VERSION}")
    try:
        meta = StateMeta.from_bytes(doc["state"])
    except RemoteProtocolError as exc:
        raise CheckpointError(f"ledger part: {exc}") from None
    norms = {}
    for item in doc["norms"]:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], bytes) and isinstance(item[1], list)
                and len(item[1]) == len(meta.shapes) and all(isinstance(x, float) and math.isfinite(x) and x >= 0.0
                                                             for x in item[1])):
            raise CheckpointError("ledger part: a norms item is [update id, one finite norm per tensor]")
        norms[item[0]] = item[1]
    if set(norms) != {e.meta.update_id for e in meta.entries}:
        raise CheckpointError("ledger part: the norms do not list exactly the window's entries")
    return meta, norms


def referenced_blobs(ckpt: Checkpoint) -> frozenset[str]:
    """The payload blobs a checkpoint refers to (none for a version 1 or 2 file, which holds its payloads);
    `CheckpointError` for a ledger part that does not decode."""
    if ckpt.version < 3:
        return frozenset()
    meta, _ = _decode_part(ckpt)
    return frozenset(e.blob for e in meta.entries)


def newest_checkpoint(checkpoints: CheckpointDir | None
                      ) -> tuple[Checkpoint | None, frozenset[str], frozenset[bytes]]:
    """The newest valid checkpoint of a node (None without one, or when its ledger part does not decode: logged),
    the payload blobs it refers to, which its restart must keep, and the update ids its ledger had seen (what
    the node need not fetch again when its peers announce them, before the ledger is restored). Blocking."""
    ckpt = checkpoints.latest() if checkpoints is not None else None
    if ckpt is None:
        return None, frozenset(), frozenset()
    try:
        if ckpt.version < 3:
            return ckpt, frozenset(), frozenset()
        meta, _ = _decode_part(ckpt)
    except CheckpointError as exc:
        log.warning("checkpoint of round %d unusable (%s): starting fresh", ckpt.round, exc)
        return None, frozenset(), frozenset()
    return ckpt, frozenset(e.blob for e in meta.entries), frozenset(meta.seen)


def _sha256_of_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _outer_arrays(ckpt: Checkpoint, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Arrays]:
    parts: dict[str, Arrays] = {key: {} for key in ("bottom/theta", "bottom/momentum", "working/theta", "working/momentum")}
    for key, a in ckpt.outer.items():
        part, _, name = key.rpartition("/")
        if part not in parts or name not in shapes:
            raise CheckpointError(f"outer array {key!r} is not bottom/ or working/ theta or momentum of a tensor")
        parts[part][name] = a
    for part, arrays in parts.items():
        if sorted(arrays) != sorted(shapes):
            raise CheckpointError(f"outer arrays of {part} do not name every tensor")
    return parts


def restore_ledger(ckpt: Checkpoint, config: LedgerConfig, shapes: Mapping[str, tuple[int, ...]],
                   bottom: BottomStore, blobs: KeepingStore) -> tuple[Ledger, LedgerSnapshot, list[tuple[int, str]]]:
    """(the ledger, the snapshot it was built from, the (target slot, blob) pairs of the window's payloads in
    `blobs`), see the module docstring. Raises `CheckpointError` (a damaged ledger part, a payload blob missing
    or damaged), `RemoteProtocolError` / `LocalProtocolError` (a state that does not load under this config
    and these shapes)."""
    if ckpt.version < 3:
        snap, rehomed = payloads_to_blobs(LedgerSnapshot.from_bytes(ckpt.ledger), blobs)
        return Ledger.from_snapshot(snap, config, shapes, bottom=bottom), snap, rehomed
    meta, norms = _decode_part(ckpt)
    arrays = _outer_arrays(ckpt, meta.shapes)

    def checked(entry) -> Path:
        try:
            path, size = blobs.path(entry.blob), blobs.size(entry.blob)
        except KeyError:
            raise CheckpointError(f"payload blob {entry.blob[:12]} is not in the blob store") from None
        if size != entry.size or _sha256_of_file(path) != entry.blob:
            raise CheckpointError(f"payload blob {entry.blob[:12]} is damaged (size or SHA-256)")
        return path

    paths = parallel_map(checked, meta.entries)
    names = sorted(meta.shapes)
    entries = []
    for e, path in zip(meta.entries, paths, strict=True):
        payload = Payload(e.codec, map_blob(path))
        deltas = PayloadDeltas.measured(payload, meta.shapes, dict(zip(names, norms[e.meta.update_id], strict=True)))
        entries.append(SnapshotEntry(e.meta, e.slot, deltas, payload))
    snap = meta.snapshot(arrays["bottom/theta"], arrays["bottom/momentum"], tuple(entries))
    ledger = Ledger.from_snapshot(snap, config, shapes, bottom=bottom,
                                  working=(arrays["working/theta"], arrays["working/momentum"]))
    ledger_digest = meta.view().ledger_digest()
    if ledger.ledger_digest() != ledger_digest or ledger.params_digest() != state_digest(meta.bottom.digest(), ledger_digest):
        raise CheckpointError("the restored ledger's digests are not the checkpoint's")
    return ledger, snap, [(e.meta.target_slot, e.blob) for e in meta.entries]
