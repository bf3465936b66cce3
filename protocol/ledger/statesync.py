"""The state a node serves to joiners, cut so that it can be fetched in verified pieces from many donors.

A :class:`~protocol.ledger.snapshot.LedgerSnapshot` has three parts of very different sizes; the state
plane (PROTOCOL.md, "State sync") moves each one its own way:

* the **meta** (:class:`StateMeta`, a few bytes per update): everything but the arrays and the payload
  bytes — slot, window bottom slot, config fingerprint, shapes, chain, seen ids, counters, finalized
  totals, each window entry's header fields with a reference (codec, SHA-256, size) to its payload blob,
  and the :class:`BottomIndex`. One msgpack blob per donor (counters differ between replicas);
* the **bottom**: the window-bottom parameters and momentum, model-sized, the same bytes on every
  replica of the same state digest. Laid out as one byte string (arrays in ascending name order,
  each little-endian C order, back to back) cut into the tree digest's pieces (``PIECE`` bytes, the
  last piece of each array shorter), so each piece is fetched from any donor and checked on its own;
* the window's **payloads**: content-addressed blobs, already held by most peers (gossip delivered them).

Verification. The :class:`BottomIndex` lists, per bottom array, its name, dtype, shape and the SHA-256 of
each piece. Its tree digest (:meth:`BottomIndex.digest`, the definition of ``protocol.ledger.digest``
recomputed from the hashes alone) with the manifest's ledger digest gives the state digest, which the
donor signed as its ``params_digest``: :func:`verify_meta` checks that, and that the meta's own ledger
digest is the manifest's, before a single piece is fetched. After that every piece is checked against
its hash before it is written, and the loaded ledger's digests against the manifest once more.

Pure: no I/O (the node's ``node.sync.statefetch`` / ``node.sync.stateserve`` move the bytes).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import msgpack
import numpy as np

from protocol.compression import Codec, payload_size
from protocol.compression.formats import as_codec_local, codec_names
from protocol.ledger.config import ID_BYTES, UpdateMeta
from protocol.ledger.digest import BOTTOM_DOMAIN, PIECE, Row, state_digest, tree_digest_of_hashes, tree_rows
from protocol.ledger.fork import SUM_BYTES, LedgerView
from protocol.ledger.proof import UpdateProof
from protocol.ledger.fields import array, bad_state, binary, seen_ids, shapes_field, string_map, uint
from protocol.ledger.snapshot import LedgerSnapshot, SnapshotEntry

__all__ = ["BOTTOM_DOMAIN", "BOTTOM_PREFIX", "META_BLOB", "BottomIndex", "IndexedArray", "MetaEntry", "Piece",
           "StateMeta", "bottom_arrays", "verify_meta"]

META_BLOB = "meta"  # the name of the meta blob in a state manifest
BOTTOM_PREFIX = "/state/bottom/"  # + <bottom digest hex>/<piece index>: where a donor serves its pieces
FORMAT = "diloco-state-meta"
VERSION = 1
HASH = 32
FLOAT_DTYPES = frozenset({"<f4", "<f8"})  # what a bottom array may be (the dtype is part of its digest)
_KEYS = frozenset({"format", "version", "slot", "base_slot", "config", "shapes", "chain", "seen", "counters",
                   "applied_tokens", "applied_sum", "entries", "bottom"})


@dataclass(frozen=True)
class Piece:
    """Piece ``index`` of the bottom: ``length`` bytes at ``offset`` of the bottom's byte string."""

    index: int
    offset: int
    length: int
    sha256: bytes


@dataclass(frozen=True)
class IndexedArray:
    """One bottom array: ``dtype`` is numpy's little-endian dtype string (``"<f8"``, ``"<f4"``),
    ``hashes`` the SHA-256 of its consecutive ``PIECE``-byte pieces (none for an empty array)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    hashes: tuple[bytes, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def bottom_arrays(snap: LedgerSnapshot) -> dict[str, np.ndarray]:
    """A snapshot's window bottom named as the bottom digest names it: ``theta/<t>``, ``momentum/<t>``."""
    return {**{"theta/" + n: a for n, a in snap.base_params.items()},
            **{"momentum/" + n: a for n, a in snap.base_momentum.items()}}


@dataclass(frozen=True)
class BottomIndex:
    """The bottom's arrays in ascending name order, with their piece hashes (module docstring)."""

    arrays: tuple[IndexedArray, ...]

    @classmethod
    def of_arrays(cls, arrays: Mapping[str, np.ndarray]) -> BottomIndex:
        """Hash ``arrays`` piece by piece (in parallel threads; the dtype is each array's own)."""
        return cls.of_rows(tree_rows(arrays))

    @classmethod
    def of_rows(cls, rows: Iterable[Row]) -> BottomIndex:
        """From a tree digest's rows (e.g. ``Ledger.bottom_rows``: hashed once, when the bottom moved)."""
        return cls(tuple(IndexedArray(name, dtype, tuple(shape), tuple(hashes)) for name, dtype, shape, hashes in rows))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    def offsets(self) -> dict[str, int]:
        """Where each array starts in the bottom's byte string."""
        out, at = {}, 0
        for a in self.arrays:
            out[a.name] = at
            at += a.nbytes
        return out

    def pieces(self) -> list[Piece]:
        """Every piece of the bottom, numbered from 0 across the arrays in order."""
        out: list[Piece] = []
        for a, start in zip(self.arrays, self.offsets().values(), strict=True):
            for k, sha in enumerate(a.hashes):
                at = k * PIECE
                out.append(Piece(len(out), start + at, min(PIECE, a.nbytes - at), sha))
        return out

    def digest(self, domain: bytes = BOTTOM_DOMAIN) -> bytes:
        """The tree digest of the arrays, from the piece hashes alone (``protocol.ledger.digest``)."""
        return tree_digest_of_hashes(((a.name, a.dtype, a.shape, a.hashes) for a in self.arrays), domain)

    def views(self, buffer: object) -> dict[str, np.ndarray]:
        """The arrays as views of ``buffer`` (the bottom's byte string, e.g. a memory-mapped file)."""
        out, flat = {}, np.frombuffer(buffer, dtype=np.uint8)
        for a, start in zip(self.arrays, self.offsets().values(), strict=True):
            out[a.name] = flat[start : start + a.nbytes].view(np.dtype(a.dtype)).reshape(a.shape)
        return out

    def to_doc(self) -> list:
        return [[a.name, a.dtype, list(a.shape), b"".join(a.hashes)] for a in self.arrays]

    @classmethod
    def of_doc(cls, x: object, shapes: Mapping[str, tuple[int, ...]]) -> BottomIndex:
        """Decode and check against ``shapes``: exactly ``momentum/<t>`` and ``theta/<t>`` per tensor, in
        ascending order, with the tensor's shape, a float dtype, and one hash per piece."""
        expected = sorted([f"momentum/{n}" for n in shapes] + [f"theta/{n}" for n in shapes])
        rows = array(x, "bottom")
        if len(rows) != len(expected):
            raise bad_state("bottom must list momentum/<t> and theta/<t> for every tensor")
        arrays = []
        for row, name in zip(rows, expected, strict=True):
            fields = array(row, "bottom array")
            if len(fields) != 4 or fields[0] != name:
                raise bad_state(f"bottom array {len(arrays)} must be [{name!r}, dtype, shape, hashes]")
            _, dtype, dims, hashes = fields
            if dtype not in FLOAT_DTYPES:
                raise bad_state(f"bottom array {name}: dtype must be one of {sorted(FLOAT_DTYPES)}")
            shape = tuple(uint(d, f"shape of {name}") for d in array(dims, f"shape of {name}"))
            if shape != tuple(shapes[name.split("/", 1)[1]]):
                raise bad_state(f"bottom array {name}: shape {shape} is not the model's")
            raw = binary(hashes, f"hashes of {name}")
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            if len(raw) != HASH * math.ceil(nbytes / PIECE):
                raise bad_state(f"bottom array {name}: {len(raw)} hash bytes for {nbytes} bytes of {PIECE}-byte pieces")
            arrays.append(IndexedArray(name, dtype, shape, tuple(raw[i : i + HASH] for i in range(0, len(raw), HASH))))
        return cls(tuple(arrays))


@dataclass(frozen=True)
class MetaEntry:
    """A window entry (an update applied at ``slot``, or held for it), its payload blob, and what it takes to
    check its origin's signature (``protocol.ledger.proof``; None when the donor does not have it)."""

    meta: UpdateMeta
    slot: int
    codec: Codec
    blob: str  # lower-case hex SHA-256 of the payload
    size: int
    proof: UpdateProof | None = None


@dataclass(frozen=True)
class StateMeta:
    """A snapshot without its arrays and payload bytes, plus the bottom's index (module docstring)."""

    slot: int
    base_slot: int
    config: Mapping[str, object]
    shapes: Mapping[str, tuple[int, ...]]
    entries: tuple[MetaEntry, ...]
    chain: bytes
    seen: tuple[bytes, ...]
    counters: Mapping[str, int]
    applied_tokens: int
    applied_sum: int
    bottom: BottomIndex

    def view(self) -> LedgerView:
        """The state as the fork choice sees it (what ``LedgerView.of_snapshot`` gives for the snapshot)."""
        return LedgerView.of_snapshot(self)

    def snapshot(self, base_params: Mapping[str, np.ndarray], base_momentum: Mapping[str, np.ndarray],
                 entries: tuple[SnapshotEntry, ...]) -> LedgerSnapshot:
        """The full snapshot, given the bottom arrays and the entries with their payloads."""
        return LedgerSnapshot(slot=self.slot, base_slot=self.base_slot, config=self.config, shapes=self.shapes,
                              base_params=base_params, base_momentum=base_momentum, entries=entries,
                              chain=self.chain, seen=self.seen, counters=self.counters,
                              applied_tokens=self.applied_tokens, applied_sum=self.applied_sum)

    @classmethod
    def of_snapshot(cls, snap: LedgerSnapshot, blobs: Mapping[bytes, tuple[Codec, str, int]],
                    bottom: BottomIndex, proofs: Mapping[bytes, UpdateProof] | None = None) -> StateMeta:
        """``snap``'s meta; ``blobs`` maps each entry's update id to its payload blob (codec, hex, size),
        ``proofs`` to its proof, where known."""
        proofs = proofs or {}
        entries = tuple(MetaEntry(e.meta, e.slot, *blobs[e.meta.update_id], proofs.get(e.meta.update_id))
                        for e in sorted(snap.entries, key=lambda e: e.meta.update_id))
        return cls(snap.slot, snap.base_slot, dict(snap.config), dict(snap.shapes), entries, snap.chain,
                   tuple(sorted(snap.seen)), dict(snap.counters), snap.applied_tokens, snap.applied_sum, bottom)

    def to_bytes(self) -> bytes:
        """The canonical encoding (msgpack, binary strings on; PROTOCOL.md "State sync")."""
        names = sorted(self.shapes)
        entries = [[e.meta.update_id, e.meta.origin, e.meta.base_slot, e.meta.publish_slot, e.meta.tokens,
                    e.meta.inner_steps, e.slot, str(e.codec), bytes.fromhex(e.blob), e.size,
                    *([e.proof.seqno, e.proof.signature, e.proof.membership] if e.proof else [])]
                   for e in self.entries]
        doc = {"format": FORMAT, "version": VERSION, "slot": self.slot, "base_slot": self.base_slot,
               "config": dict(self.config), "shapes": {n: list(self.shapes[n]) for n in names},
               "chain": self.chain, "seen": b"".join(self.seen), "counters": dict(sorted(self.counters.items())),
               "applied_tokens": self.applied_tokens, "applied_sum": self.applied_sum.to_bytes(SUM_BYTES, "big"),
               "entries": entries, "bottom": self.bottom.to_doc()}
        return msgpack.packb(doc, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes) -> StateMeta:
        """Decode and check every type, length, order and count; ``RemoteProtocolError(BAD_STATE)``
        otherwise (the bytes come from a peer). Whether it is the signed state: :func:`verify_meta`."""
        try:
            doc = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
        except (msgpack.UnpackException, ValueError, TypeError) as exc:
            raise bad_state(f"undecodable meta: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise bad_state(f"not a {FORMAT} of version {VERSION}")
        if set(doc) != _KEYS:
            raise bad_state("the meta must be a map with exactly the keys of its version")
        slot, base = uint(doc["slot"], "slot"), uint(doc["base_slot"], "base_slot")
        if base > slot:
            raise bad_state("base_slot > slot")
        string_map(doc["config"], "config")
        shapes = shapes_field(doc["shapes"])
        chain, applied_sum = binary(doc["chain"], "chain"), binary(doc["applied_sum"], "applied_sum")
        if len(chain) != 32 or len(applied_sum) != SUM_BYTES:
            raise bad_state(f"chain must be 32 bytes, applied_sum {SUM_BYTES}")
        seen = seen_ids(doc["seen"])
        counters = string_map(doc["counters"], "counters")
        entries = tuple(_entry(x, shapes) for x in array(doc["entries"], "entries"))
        if any(a.meta.update_id >= b.meta.update_id for a, b in zip(entries, entries[1:], strict=False)):
            raise bad_state("entries must be sorted by update id, ids unique")
        return cls(slot, base, doc["config"], shapes, entries, chain, seen,
                   {k: uint(v, f"counters[{k}]") for k, v in counters.items()},
                   uint(doc["applied_tokens"], "applied_tokens"), int.from_bytes(applied_sum, "big"),
                   BottomIndex.of_doc(doc["bottom"], shapes))


def _entry(x: object, shapes: Mapping[str, tuple[int, ...]]) -> MetaEntry:
    fields = array(x, "entry")
    if len(fields) not in (10, 13):
        raise bad_state("a meta entry has 10 fields, or 13 with its proof")
    update_id, origin, base_slot, publish_slot, tokens, steps, slot, codec, sha, size = fields[:10]
    proof = None
    if len(fields) == 13:
        seqno, signature, membership = fields[10:]
        signature, membership = binary(signature, "entry signature"), binary(membership, "entry membership")
        if len(signature) != 64 or len(membership) > 512:
            raise bad_state("an entry's signature is 64 bytes, its membership at most 512")
        proof = UpdateProof(uint(seqno, "entry seqno"), signature, membership)
    update_id, sha = binary(update_id, "entry id"), binary(sha, "entry payload sha256")
    if len(update_id) != ID_BYTES or len(sha) != HASH or not isinstance(origin, str):
        raise bad_state("an entry's id and payload hash are 32 bytes, its origin a string")
    if not isinstance(codec, str) or codec not in codec_names():
        raise bad_state(f"entry codec {codec!r} is unknown")
    if uint(size, "entry payload size") != payload_size(shapes, codec):
        raise bad_state(f"entry payload of {size} bytes is not a {codec} payload of the model's shapes")
    meta = UpdateMeta(update_id=update_id, origin=origin, base_slot=uint(base_slot, "entry base_slot"),
                      publish_slot=uint(publish_slot, "entry publish_slot"), tokens=uint(tokens, "entry tokens"),
                      inner_steps=uint(steps, "entry inner_steps"))
    return MetaEntry(meta, uint(slot, "entry slot"), as_codec_local(codec), sha.hex(), size, proof)


def verify_meta(meta: StateMeta, slot: int, ledger_digest: bytes, params_digest: bytes) -> None:
    """Refuse (``BAD_STATE``) a meta that is not the signed state ``(slot, ledger_digest, params_digest)``:
    its slot and its ledger digest must be the manifest's, and the state digest of its bottom index's
    tree digest and that ledger digest must be the signed ``params_digest``. After this, each bottom
    piece is verified by its hash alone."""
    if meta.slot != slot:
        raise bad_state(f"meta of slot {meta.slot}, manifest of slot {slot}")
    if meta.view().ledger_digest() != ledger_digest:
        raise bad_state("the meta's ledger digest is not the manifest's")
    if state_digest(meta.bottom.digest(), ledger_digest) != params_digest:
        raise bad_state("the meta's bottom index does not give the manifest's params digest")
