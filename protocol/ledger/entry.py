"""Checking an update's deltas and making the ledger's entry for it (``Ledger.add``, ``from_snapshot``).

Names, shapes and dtypes are checked first, then every tensor's norm is computed (in parallel threads),
which is also the finiteness check; nothing the caller passed is changed unless every tensor passed.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.ledger.aggregate import SlotEntry
from protocol.ledger.chunks import copy_with_norm, tensor_norm
from protocol.ledger.config import UpdateMeta
from protocol.ledger.payload import Payload, PayloadDeltas, check_payload
from protocol.parallel import parallel_map

__all__ = ["make_entry"]


def make_entry(
    meta: UpdateMeta,
    slot: int,
    deltas: Mapping[str, np.ndarray],
    payload: Payload | None,
    shapes: Mapping[str, tuple[int, ...]],
    weight: float,
) -> tuple[SlotEntry, Mapping[str, np.ndarray]]:
    """The entry to keep for an update applied (or held) at ``slot`` with ``weight`` (its deltas: the
    payload when there is one, else the arrays) and the float32 arrays to apply now (the caller's, or
    their copies). A payload's :class:`PayloadDeltas` that were validated already (a snapshot's) are not
    decoded again. Raises ``RemoteProtocolError`` (names, shapes, non-finite) or ``LocalProtocolError``
    (not float32, a payload of the wrong size)."""
    check_payload(payload, shapes)
    if isinstance(deltas, PayloadDeltas) and deltas.norms is not None and deltas.payload is payload \
            and deltas.shapes == dict(shapes):  # decoded, checked and measured already (a snapshot's)
        return SlotEntry(meta=meta, slot=slot, weight=weight, deltas=deltas, norms=dict(deltas.norms),
                         payload=payload), deltas
    if sorted(deltas) != list(shapes):
        raise RemoteProtocolError(Reason.SHAPE_MISMATCH,
                                  f"tensor names differ from the model's: {sorted(deltas)[:4]}…")
    given = {name: deltas[name] for name in shapes}
    for name, shape in shapes.items():
        x = given[name]
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise LocalProtocolError(f"{name}: deltas must be float32 numpy arrays (dequantize first)")
        if x.shape != shape:
            raise RemoteProtocolError(Reason.SHAPE_MISMATCH, f"{name}: shape {x.shape}, expected {shape}")
    adopt = {name: x.flags.c_contiguous and (x.flags.owndata or payload is not None) for name, x in given.items()}

    def one(name: str) -> tuple[np.ndarray, float]:
        x = given[name]
        if adopt[name]:  # adopt (or only read, when the payload is kept)
            return x, tensor_norm(x)
        copy, norm = copy_with_norm(x)
        copy.flags.writeable = False
        return copy, norm

    now: dict[str, np.ndarray] = {}
    norms: dict[str, float] = {}
    for name, (x, norm) in zip(given, parallel_map(one, given), strict=True):
        if not np.isfinite(norm):
            raise RemoteProtocolError(Reason.NON_FINITE, f"{name} has non-finite values")
        now[name], norms[name] = x, norm
    if payload is not None:
        kept: Mapping[str, np.ndarray] = PayloadDeltas.measured(payload, shapes, norms)  # the payload's norms
    else:
        kept = now
        for name in given:  # only once every tensor passed: a refused update leaves the caller's arrays alone
            if adopt[name]:
                given[name].flags.writeable = False
    return SlotEntry(meta=meta, slot=slot, weight=weight, deltas=kept, norms=norms, payload=payload), now
