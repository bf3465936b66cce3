"""An update's encoded payload, kept beside its float32 deltas so a snapshot can store the payload instead.

A :class:`Payload` is the codec and the bytes of the blob an update was published with (see
:mod:`protocol.compression`); ``decode_tensors(data, codec, shapes)`` gives exactly the update's float32
deltas. That is the caller's contract when it hands one to ``Ledger.add``: the ledger checks only what
is cheap (types, codec, the exact size for its shapes), never decodes. A snapshot stores the payload
(int4: ~7.5× smaller than float32) and its reader decodes it (:func:`decode_snapshot_payload`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from protocol.compression import Codec, decode_tensors, payload_size
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError

__all__ = ["Payload", "check_payload", "decode_snapshot_payload"]


@dataclass(frozen=True)
class Payload:
    """``data`` encoded with ``codec``: the update's deltas, in sorted-name order."""

    codec: Codec
    data: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.codec, Codec) or not isinstance(self.data, bytes):
            raise LocalProtocolError("a payload is a Codec and bytes")


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
) -> tuple[Payload, dict[str, np.ndarray]]:
    """A peer's (codec, payload) pair → the payload and its read-only float32 deltas. Anything that does
    not decode (unknown codec, wrong size for ``shapes``, non-finite or malformed values) is
    ``RemoteProtocolError(BAD_STATE)``: inside a snapshot, a bad payload is a bad state."""
    if not isinstance(codec, str) or not isinstance(data, bytes):
        raise RemoteProtocolError(Reason.BAD_STATE, "an entry payload is a codec name and bytes")
    try:
        deltas = decode_tensors(data, codec, shapes)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(Reason.BAD_STATE, f"entry payload: {exc}") from None
    for x in deltas.values():
        x.flags.writeable = False
    return Payload(Codec(codec), data), deltas
