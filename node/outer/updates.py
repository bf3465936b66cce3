"""Glue between signed update headers, their payload blobs and the ledger.

Outgoing: `make_delta` (Δ = θ_base − θ_local) and `compress` (error feedback → the payload, whose decode
every receiver, and the sender's own ledger, reads). Incoming: `accept_hook`
refuses headers that cannot fit this node's model before any download (the router counts and penalizes);
`decode_update` checks a fetched payload, tensor by tensor, and hands the ledger the `Payload` and its
`PayloadDeltas` (which decode a tensor when read: nothing model-sized is kept decoded), refusing bad
ones with a named `Reason`;
`update_meta` copies the header fields the ledger uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from node.outer.outer_files import drop_pages, map_blob
from protocol.compression import ErrorFeedback, payload_size
from protocol.compression.formats import as_codec_remote
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import LedgerConfig, Payload, PayloadDeltas, UpdateMeta
from protocol.ledger.bound import check_claim
from protocol.ledger.weights import check_meta
from protocol.ledger.chunks import tensor_norm
from protocol.ledger.proof import header_shapes
from protocol.messages import Signed, UpdateHeader

__all__ = ["Shapes", "accept_hook", "compress", "decode_update", "make_delta", "shapes_field", "update_meta"]

Shapes = Mapping[str, tuple[int, ...]]


shapes_field = header_shapes  # the `shapes` field of an UpdateHeader (protocol.ledger.proof)


def update_meta(signed: Signed) -> UpdateMeta:
    """The ledger's view of a signed update header (its id is the message id)."""
    h: UpdateHeader = signed.body
    return UpdateMeta(update_id=signed.message_id, origin=h.origin, base_slot=h.base_slot,
                      publish_slot=h.publish_slot, tokens=h.tokens, inner_steps=h.inner_steps)


def check_header(header: UpdateHeader, shapes: Shapes) -> None:
    """Refuse (SHAPE_MISMATCH) a header whose tensors are not exactly this model's."""
    if header.shapes != shapes_field(shapes):
        names = [n for n, _ in header.shapes][:3]
        raise RemoteProtocolError(Reason.SHAPE_MISMATCH, f"tensors {names}… do not match the model")


def accept_hook(shapes: Shapes, ledger: LedgerConfig | None = None) -> Callable[[Signed], None]:
    """For `HostConfig.accept`: refuse, from the header alone, an update for another model, with impossible
    slots or counts, claiming more work than the run allows (`ledger`'s limits: `bad_claim`), or for a slot
    after the run's end (`past_end`) — before
    its payload is fetched and before it is forwarded, so the peer that sent it is the one penalised."""
    expected = shapes_field(shapes)

    def accept(signed: Signed) -> None:
        body = signed.body
        if not isinstance(body, UpdateHeader):
            return
        if body.shapes != expected:
            raise RemoteProtocolError(Reason.SHAPE_MISMATCH,
                                      f"update {signed.message_id.hex()[:12]} is for another model")
        if ledger is not None:
            meta = update_meta(signed)
            check_meta(meta)
            check_claim(meta, ledger)
            if ledger.end_slot is not None and meta.target_slot > ledger.end_slot:
                raise RemoteProtocolError(Reason.PAST_END, f"update {signed.message_id.hex()[:12]} is for slot "
                                          f"{meta.target_slot}, after the run's last slot {ledger.end_slot}")

    return accept


def decode_update(header: UpdateHeader, blob: Path | bytes, shapes: Shapes) -> tuple[PayloadDeltas, Payload]:
    """A fetched payload's deltas, checked (every tensor decoded once, in parallel threads, its norm kept),
    and the payload (for `Ledger.add`; a stored blob is kept memory-mapped, `map_blob`). The deltas decode
    a tensor whenever the ledger reads one: no model-sized float32 copy. Raises RemoteProtocolError
    (SHAPE_MISMATCH, BAD_CODEC, NON_FINITE, MALFORMED) for a payload that does not fit; blocking (file
    read), run it in a thread."""
    check_header(header, shapes)
    data = map_blob(blob) if isinstance(blob, Path) else bytes(blob)
    payload = Payload(as_codec_remote(header.codec), data)
    expected = payload_size(shapes, payload.codec)
    if len(data) != expected:
        raise RemoteProtocolError(Reason.SHAPE_MISMATCH, f"{payload.codec} payload is {len(data)} bytes, "
                                  f"the shapes need {expected}")
    deltas = PayloadDeltas.validated(payload, shapes)
    drop_pages(data)
    return deltas, payload


def make_delta(base: Mapping[str, np.ndarray], local: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The pseudo-gradient Δ = θ_base − θ_local, float32, per tensor."""
    return {name: np.asarray(base[name] - local[name], dtype=np.float32) for name in base}


def compress(feedback: ErrorFeedback, delta: dict[str, np.ndarray]) -> tuple[bytes, dict[str, float]]:
    """The payload of Δ with error feedback, and the norm of each tensor of its decode (what the ledger
    needs to add it: measured as the residual is made, not by decoding the payload again); `delta` (from
    `make_delta`) becomes the next residual in place (`ErrorFeedback.compress_payload`)."""
    norms: dict[str, float] = {}

    def measure(name: str, tensor: np.ndarray) -> None:
        norms[name] = tensor_norm(tensor)

    return feedback.compress_payload(delta, measure), norms
