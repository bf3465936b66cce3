"""An update's encoded payload: what the ledger keeps of an update instead of its float32 deltas.

A :class:`Payload` is the codec and the bytes of the blob an update was published with (see
:mod:`protocol.compression`); ``decode_tensors(data, codec, shapes)`` gives exactly the update's float32
deltas. That is the caller's contract when it hands one to ``Ledger.add``: the ledger checks only what
is cheap (types, codec, the exact size for its shapes). It then keeps the payload (int4: ~0.53 bytes per
parameter against 4 for float32) as :class:`PayloadDeltas`, which decode a span of a tensor whenever the
ledger reads one, and a snapshot stores the payload too; its reader checks that every tensor decodes
(:func:`decode_snapshot_payload`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from protocol.compression.formats import as_codec_local, codec_names
from protocol.compression import Codec, add_decoded_span, decode_span, decode_span_into, payload_size, record_offsets
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.ledger.chunks import flat, tensor_norm
from protocol.parallel import parallel_map

__all__ = ["Payload", "PayloadDeltas", "check_payload", "decode_snapshot_payload", "span_of"]


@dataclass(frozen=True)
class Payload:
    """``data`` encoded with ``codec``: the update's deltas, in sorted-name order. ``data`` is bytes, or a
    read-only byte memoryview (e.g. of a memory-mapped blob file, so the payload stays on disk: see
    ``node.outer.outer_files.map_blob``)."""

    codec: Codec | str  # a registered codec's name is a plain str (protocol.compression.formats)
    data: bytes | memoryview

    def __post_init__(self) -> None:
        view = self.data if isinstance(self.data, memoryview) else None
        if not isinstance(self.codec, str) or self.codec not in codec_names() or not (
            isinstance(self.data, bytes) or (view is not None and view.readonly and view.format == "B")
        ):
            raise LocalProtocolError("a payload is a known codec and bytes (or a read-only byte memoryview)")
        object.__setattr__(self, "codec", as_codec_local(self.codec))  # a built-in's name becomes its Codec


class PayloadDeltas(Mapping[str, np.ndarray]):
    """An update's deltas as its payload: ``deltas[name]`` decodes that tensor (a fresh read-only float32
    array, the exact bits of ``decode_tensors``), :meth:`span` decodes a span of its flat view. Nothing
    decoded is kept: memory is the payload's size. The payload must decode (checked by whoever made it)."""

    def __init__(self, payload: Payload, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.payload = payload
        self.shapes = {name: tuple(shapes[name]) for name in sorted(shapes)}
        self._offsets = record_offsets(self.shapes, payload.codec)
        self.norms: dict[str, float] | None = None  # each tensor's norm, once `validated` computed them

    @classmethod
    def validated(cls, payload: Payload, shapes: Mapping[str, tuple[int, ...]]) -> PayloadDeltas:
        """Decode every tensor once (in parallel threads), checking it (``RemoteProtocolError``), and keep
        its norm (``tensor_norm``), so that the ledger need not decode it again to add the entry."""
        deltas = cls(payload, shapes)
        names = list(deltas.shapes)
        deltas.norms = dict(zip(names, parallel_map(lambda name: tensor_norm(deltas[name]), names), strict=True))
        return deltas

    @classmethod
    def measured(cls, payload: Payload, shapes: Mapping[str, tuple[int, ...]], norms: Mapping[str, float]) -> PayloadDeltas:
        """A payload whose tensors were decoded and measured already (``tensor_norm`` of each decoded
        tensor, e.g. by its sender while compressing, or a snapshot's check): what :meth:`validated` gives,
        without decoding again."""
        deltas = cls(payload, shapes)
        deltas.norms = {name: norms[name] for name in deltas.shapes}
        return deltas

    def span(self, name: str, span: slice) -> np.ndarray:
        """Elements ``span`` (a slice starting at a multiple of the codec block) of the flat tensor."""
        numel = math.prod(self.shapes[name])
        stop = min(span.stop, numel)
        return decode_span(self.payload.data, self.payload.codec, self._offsets[name], numel, name, span.start, stop)

    def add_span(self, name: str, span: slice, u: np.ndarray, c: float, first: bool, x: np.ndarray | None = None) -> bool:
        """``u (+)= float64(span)·c`` with the span decoded on the way (into ``x`` too, when given), in one
        compiled pass (``protocol.compression.add_decoded_span``); False when that did not run (then
        nothing was written and the caller decodes with :meth:`span`)."""
        numel = math.prod(self.shapes[name])
        return add_decoded_span(self.payload.data, self.payload.codec, self._offsets[name], numel, name, span.start,
                                min(span.stop, numel), u, c, first, x)

    def decode_into(self, name: str, span: slice, out: np.ndarray) -> bool:
        """:meth:`span` decoded into the float32 ``out`` in one compiled pass; False when that did not run
        (nothing was written: the caller decodes with :meth:`span`)."""
        numel = math.prod(self.shapes[name])
        return decode_span_into(self.payload.data, self.payload.codec, self._offsets[name], numel, name, span.start,
                                min(span.stop, numel), out)

    def __getitem__(self, name: str) -> np.ndarray:
        shape = self.shapes[name]
        x = self.span(name, slice(0, math.prod(shape))).reshape(shape)
        x.flags.writeable = False
        return x

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def span_of(deltas: Mapping[str, np.ndarray], name: str, span: slice) -> np.ndarray:
    """Elements ``span`` of tensor ``name``'s flat view: decoded from a payload, or a view of the array (an
    entry's arrays are C-contiguous)."""
    if isinstance(deltas, PayloadDeltas):
        return deltas.span(name, span)
    return flat(deltas[name])[span]


def check_payload(payload: Payload | None, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse (``LocalProtocolError``) a payload that cannot be an encoding of tensors of ``shapes``."""
    if payload is None:
        return
    if not isinstance(payload, Payload):
        raise LocalProtocolError(f"payload must be a Payload or None, got {type(payload).__name__}")
    expected = payload_size(shapes, payload.codec)
    if len(payload.data) != expected:
        raise LocalProtocolError(f"{payload.codec} payload is {len(payload.data)} bytes, the shapes need {expected}")


def decode_snapshot_payload(
    codec: object, data: object, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[Payload, PayloadDeltas]:
    """A peer's (codec, payload) pair (bytes, or a read-only memoryview of a mapped blob) → the payload and
    its deltas, once every tensor was decoded and found valid (:meth:`PayloadDeltas.validated`, which
    keeps the norms). Anything that does not decode
    (unknown codec, wrong size for ``shapes``, non-finite or malformed values) is
    ``RemoteProtocolError(BAD_STATE)``: inside a snapshot, a bad payload is a bad state."""
    if not isinstance(codec, str) or not isinstance(data, bytes | memoryview) or codec not in codec_names():
        raise RemoteProtocolError(Reason.BAD_STATE, "an entry payload is a known codec name and bytes")
    payload = Payload(as_codec_local(codec), data)
    try:
        check_payload(payload, shapes)
    except LocalProtocolError as exc:
        raise RemoteProtocolError(Reason.BAD_STATE, f"entry payload: {exc}") from None
    try:
        return payload, PayloadDeltas.validated(payload, shapes)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(Reason.BAD_STATE, f"entry payload: {exc}") from None
