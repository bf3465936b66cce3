"""The ledger's full state as plain data, and its one byte encoding (msgpack + raw array bytes, no pickle).

A :class:`LedgerSnapshot` holds what a joining node needs to continue exactly where the donor is: the
float64 state at the bottom of the window, every update applied in the window and the open slot (and the
held future ones) with their deltas (as the encoded payload they were published with when the ledger has
it, else as float32), the chain digest of the final slots, every update id ever seen (deduplication), the
counters, the config fingerprint, and the totals of the finalized slots (tokens and placement sum, which
the fork choice of :mod:`protocol.ledger.fork` compares). The working state is not stored: the loader
replays the canonical state (see :class:`~protocol.ledger.ledger.Ledger`).

Versions: 5 stores the base state as float32 (the ledger's state dtype,
:data:`~protocol.ledger.storage.STATE_DTYPE`; float64 before) and each raw array or payload either as one
bin or, when it does not fit in one, as a list of bins (as version 4); it is the version written. Version
4 stores every raw array and every entry payload as a list of bins (a msgpack bin holds at
most 4 GiB − 1 bytes: a float64 tensor of 2^29 elements does not fit in one), concatenated on read. It is
written only when some array or payload does not fit in one bin; otherwise the snapshot is written as
version 3, so nodes that read only up to version 3 still sync from smaller models. 3 lets an entry carry
its encoded payload instead of float32 deltas (int4: ~7.5× fewer bytes); 2 added ``applied_tokens`` (u64)
and ``applied_sum`` (40 bytes, big-endian). Versions 1 to 5 are read (a float64 base state is rounded to
float32 when loaded). A version 1 snapshot is read only
while nothing has been finalized (``base_slot`` 0: both totals are 0); past that its totals are unknown
and it is refused (a node then starts fresh and syncs from its peers).

Encoding (msgpack, binary strings on): a map with exactly the keys of ``_KEYS``; arrays are raw
little-endian C-order bytes whose dtype is fixed by the field and version (the base state: float32 from
version 5, float64 before; deltas: float32) and whose shape comes from ``"shapes"``. An entry is ``[update_id, origin, base_slot,
publish_slot, tokens, inner_steps, slot, deltas]``, sorted by ``update_id``, where ``deltas`` is either a
map of raw float32 arrays or (version 3) ``[codec, payload]``: a codec name of
:mod:`protocol.compression` and the payload bytes, which ``decode_tensors`` turns into the float32
deltas. In version 4 each raw array and each payload is instead a non-empty list of bins whose
concatenation is those bytes (the writer cuts them into pieces of ``_PIECE`` bytes). Every other field
is the same in all versions. :meth:`LedgerSnapshot.from_bytes` checks every type, length and count,
decodes every payload, and refuses anything else with ``RemoteProtocolError(Reason.BAD_STATE)``: the
bytes come from a peer.

Memory: :meth:`LedgerSnapshot.to_pieces` gives the encoding as headers and read-only views of the arrays
(nothing copied), so a writer streams a big snapshot (``node.checkpoint``); :meth:`~LedgerSnapshot.to_bytes`
joins them into one new buffer. :meth:`~LedgerSnapshot.from_bytes` copies each bin once (msgpack), and a
version 4 array once more while its bins are joined (those bins are released right after).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import msgpack
import numpy as np

from protocol.ledger.config import ID_BYTES, UpdateMeta
from protocol.ledger.fields import array, bad_state, binary, seen_ids, shapes_field, string_map, uint
from protocol.ledger.fork import SUM_BYTES
from protocol.ledger.payload import Payload, decode_snapshot_payload

__all__ = ["LedgerSnapshot", "SnapshotEntry"]

FORMAT = "diloco-ledger-snapshot"
VERSION = 5  # the newest version this module reads, and the one ``to_pieces`` writes
_BIN_MAX = (1 << 32) - 1  # the most bytes one msgpack bin holds
_PIECE = 1 << 30  # version 4 cuts each array and payload into bins of this many bytes (the last shorter)
_KEYS_V1 = frozenset(
    {
        "format",
        "version",
        "slot",
        "base_slot",
        "config",
        "shapes",
        "base_params",
        "base_momentum",
        "entries",
        "chain",
        "seen",
        "counters",
    }
)
_KEYS = _KEYS_V1 | {"applied_tokens", "applied_sum"}
_F64 = np.dtype("<f8")
_F32 = np.dtype("<f4")


@dataclass(frozen=True)
class SnapshotEntry:
    """An update applied at ``slot`` (or held for it, when ``slot`` is past the open one); ``payload``,
    when known, decodes exactly to ``deltas`` and is what the encoding stores."""

    meta: UpdateMeta
    slot: int
    deltas: Mapping[str, np.ndarray]
    payload: Payload | None = None


@dataclass(frozen=True)
class LedgerSnapshot:
    """Plain-data ledger state. ``seen`` is sorted; ``counters`` maps counter names to counts;
    ``applied_tokens``/``applied_sum``: totals over the finalized slots (``protocol.ledger.fork``)."""

    slot: int
    base_slot: int
    config: Mapping[str, object]
    shapes: Mapping[str, tuple[int, ...]]
    base_params: Mapping[str, np.ndarray]
    base_momentum: Mapping[str, np.ndarray]
    entries: tuple[SnapshotEntry, ...]
    chain: bytes
    seen: tuple[bytes, ...]
    counters: Mapping[str, int]
    applied_tokens: int = 0
    applied_sum: int = 0

    def to_pieces(self) -> list[bytes | memoryview]:
        """The canonical encoding as pieces whose concatenation is :meth:`to_bytes`: msgpack headers and
        read-only views of the arrays and payloads (an array is copied only if its dtype or layout is not
        the encoded one). The views keep the arrays alive; the arrays must not change while they are used.
        Version 5; an array or payload too big for one bin is a list of bins."""
        names = sorted(self.shapes)
        blobs: list[_Blob] = []

        def blob(data: object) -> _Blob:
            blobs.append(_Blob(data))
            return blobs[-1]

        def raw(arrays: Mapping[str, np.ndarray], dtype: np.dtype) -> dict[str, _Blob]:
            return {n: blob(np.ascontiguousarray(arrays[n], dtype=dtype).reshape(-1).view(np.uint8)) for n in names}

        base_params, base_momentum = raw(self.base_params, _F32), raw(self.base_momentum, _F32)
        entries = [
            [
                e.meta.update_id,
                e.meta.origin,
                e.meta.base_slot,
                e.meta.publish_slot,
                e.meta.tokens,
                e.meta.inner_steps,
                e.slot,
                raw(e.deltas, _F32) if e.payload is None else [str(e.payload.codec), blob(e.payload.data)],
            ]
            for e in sorted(self.entries, key=lambda e: e.meta.update_id)
        ]
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "slot": self.slot,
            "base_slot": self.base_slot,
            "config": dict(self.config),
            "shapes": {n: list(self.shapes[n]) for n in names},
            "base_params": base_params,
            "base_momentum": base_momentum,
            "entries": entries,
            "chain": self.chain,
            "seen": b"".join(sorted(self.seen)),
            "counters": dict(sorted(self.counters.items())),
            "applied_tokens": self.applied_tokens,
            "applied_sum": self.applied_sum.to_bytes(SUM_BYTES, "big"),
        }
        pieces: list[bytes | memoryview] = []
        _pack(doc, pieces, msgpack.Packer(use_bin_type=True))
        return pieces

    def to_bytes(self) -> bytes:
        """The canonical encoding (equal snapshots give equal bytes): :meth:`to_pieces` joined, so the only
        copy of the arrays is the result."""
        return b"".join(self.to_pieces())

    @classmethod
    def from_bytes(cls, data: bytes) -> LedgerSnapshot:
        """Decode and structurally validate ``data`` (bytes or any bytes-like object, versions 1 to 4);
        ``RemoteProtocolError(BAD_STATE)`` on anything unexpected. Consistency with a config and a model
        is checked by ``Ledger.from_snapshot``."""
        try:
            doc = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
        except (msgpack.UnpackException, ValueError, TypeError) as exc:
            raise bad_state(f"undecodable: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or type(doc.get("version")) is not int \
                or doc["version"] not in (1, 2, 3, 4, VERSION):
            version = doc.get("version") if isinstance(doc, dict) else None
            raise bad_state(f"not a snapshot of a supported version (got {version!r}, reading 1 to {VERSION})")
        if set(doc) != (_KEYS_V1 if doc["version"] == 1 else _KEYS):
            raise bad_state(f"top level must be a map with exactly the keys of a version {doc['version']} snapshot")
        slot, base = uint(doc["slot"], "slot"), uint(doc["base_slot"], "base_slot")
        if base > slot:
            raise bad_state("base_slot > slot")
        if doc["version"] == 1:
            if base:
                raise bad_state("a version 1 snapshot past slot 0 of its window lacks the finalized totals")
            doc.update(applied_tokens=0, applied_sum=bytes(SUM_BYTES))
        applied_sum = binary(doc["applied_sum"], "applied_sum")
        if len(applied_sum) != SUM_BYTES:
            raise bad_state(f"applied_sum must be {SUM_BYTES} bytes")
        string_map(doc["config"], "config")
        shapes = shapes_field(doc["shapes"])
        version = doc["version"]
        base_dtype = _F32 if version >= 5 else _F64
        entries = tuple(_entry(x, shapes, version) for x in array(doc["entries"], "entries"))
        chain = binary(doc["chain"], "chain")
        if len(chain) != 32:
            raise bad_state("chain must be 32 bytes")
        seen = seen_ids(doc["seen"])
        counters = string_map(doc["counters"], "counters")
        return cls(
            slot=slot,
            base_slot=base,
            config=doc["config"],
            shapes=shapes,
            base_params=_arrays(doc["base_params"], shapes, base_dtype, "base_params", version),
            base_momentum=_arrays(doc["base_momentum"], shapes, base_dtype, "base_momentum", version),
            entries=entries,
            chain=chain,
            seen=seen,
            counters={k: uint(v, f"counters[{k}]") for k, v in counters.items()},
            applied_tokens=uint(doc["applied_tokens"], "applied_tokens"),
            applied_sum=int.from_bytes(applied_sum, "big"),
        )


class _Blob:
    """Raw bytes that ``_pack`` writes as one bin (version 3) or as a list of bins (version 4)."""

    __slots__ = ("view",)

    def __init__(self, data: object) -> None:
        self.view = memoryview(data).cast("B").toreadonly()


def _bin_header(size: int) -> bytes:
    """The bin header msgpack writes for ``size`` bytes (the smallest that fits; none past ``_BIN_MAX``)."""
    if size < 1 << 8:
        return b"\xc4" + size.to_bytes(1, "big")
    if size < 1 << 16:
        return b"\xc5" + size.to_bytes(2, "big")
    return b"\xc6" + size.to_bytes(4, "big")  # OverflowError past _BIN_MAX


def _pack(x: object, out: list[bytes | memoryview], packer: msgpack.Packer) -> None:
    """Append to ``out`` the msgpack encoding of ``x`` (``msgpack.packb(x, use_bin_type=True)``, byte for
    byte, with each ``_Blob`` as a bin, or, if it does not fit one, as an array of bins of ``_PIECE`` bytes)."""
    if isinstance(x, _Blob):
        if len(x.view) <= _BIN_MAX:
            out += [_bin_header(len(x.view)), x.view]
            return
        cuts = range(0, max(len(x.view), 1), _PIECE)  # an empty blob is one empty bin
        out.append(packer.pack_array_header(len(cuts)))
        for i in cuts:
            piece = x.view[i : i + _PIECE]
            out += [_bin_header(len(piece)), piece]
    elif type(x) is dict:
        out.append(packer.pack_map_header(len(x)))
        for k, v in x.items():
            _pack(k, out, packer)
            _pack(v, out, packer)
    elif type(x) is list:
        out.append(packer.pack_array_header(len(x)))
        for v in x:
            _pack(v, out, packer)
    else:
        out.append(packer.pack(x))


def _blob(x: object, what: str, version: int) -> bytes:
    """A raw array or payload: bytes (versions 1 to 3; 5 when it fits a bin), or a non-empty list of bins
    joined (version 4; 5 when it does not fit a bin; the list is emptied so its bins are freed as soon as
    they are joined)."""
    if version < 4 or (version >= 5 and isinstance(x, bytes)):
        return binary(x, what)
    bins = array(x, what)
    if not bins or not all(isinstance(b, bytes) for b in bins):
        raise bad_state(f"{what} must be a non-empty array of bins")
    joined = bins[0] if len(bins) == 1 else b"".join(bins)
    bins.clear()
    return joined


def _arrays(
    x: object, shapes: Mapping[str, tuple[int, ...]], dtype: np.dtype, what: str, version: int
) -> dict[str, np.ndarray]:
    """Raw bytes per name → read-only arrays of ``dtype``; exact names, lengths, finite values."""
    if not isinstance(x, dict) or set(x) != set(shapes):
        raise bad_state(f"{what} must name exactly the tensors of shapes")
    out = {}
    for name, shape in shapes.items():
        raw = _blob(x[name], f"{what}[{name}]", version)
        if len(raw) != math.prod(shape) * dtype.itemsize:
            raise bad_state(f"{what}[{name}] has {len(raw)} bytes, expected {math.prod(shape) * dtype.itemsize}")
        arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if not np.isfinite(arr).all():
            raise bad_state(f"{what}[{name}] has non-finite values")
        out[name] = arr
    return out


def _entry(x: object, shapes: Mapping[str, tuple[int, ...]], version: int) -> SnapshotEntry:
    fields = array(x, "entry")
    if len(fields) != 8:
        raise bad_state("an entry has 8 fields")
    update_id, origin, base_slot, publish_slot, tokens, steps, slot, deltas = fields
    if not isinstance(origin, str):
        raise bad_state("entry origin must be a string")
    update_id = binary(update_id, "entry id")
    if len(update_id) != ID_BYTES:
        raise bad_state("entry id must be 32 bytes")
    meta = UpdateMeta(
        update_id=update_id,
        origin=origin,
        base_slot=uint(base_slot, "entry base_slot"),
        publish_slot=uint(publish_slot, "entry publish_slot"),
        tokens=uint(tokens, "entry tokens"),
        inner_steps=uint(steps, "entry inner_steps"),
    )
    slot = uint(slot, "entry slot")
    if isinstance(deltas, dict):
        return SnapshotEntry(meta=meta, slot=slot, deltas=_arrays(deltas, shapes, _F32, "entry deltas", version))
    with_payloads = version >= 3
    if not with_payloads or not isinstance(deltas, list) or len(deltas) != 2:
        raise bad_state("entry deltas must be a map of float32 arrays" + (" or [codec, payload]" if with_payloads else ""))
    codec, data = deltas
    payload, decoded = decode_snapshot_payload(codec, _blob(data, "entry payload", version), shapes)
    return SnapshotEntry(meta=meta, slot=slot, deltas=decoded, payload=payload)
