"""Proofs of window entries: what a peer needs to check that an entry of a state it was sent is an update
its origin signed (PROTOCOL.md §11b, "Entries carry their signatures").

A ledger keeps of each update only what its math uses (`UpdateMeta`); the signed header also held the
seqno, the codec, the tensor shapes, the payload's SHA-256 and size, and (closed runs) the membership. A
state's meta entry carries the codec, payload hash and size already; `UpdateProof` adds the rest that the
model does not give (seqno, signature, membership). From an entry and the model's shapes,
`check_entry` rebuilds the exact signed header, verifies its signature and that its message id is the
entry's update id. So a peer serving a state (to a joiner, or to a replica repairing) can leave out
updates but cannot add one that its origin did not sign, nor change what an origin claimed.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from protocol.compression import Codec
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.ledger.config import UpdateMeta
from protocol.messages import Signed, UpdateHeader

__all__ = ["UpdateProof", "check_entry", "header_shapes", "proof_of", "proofs_doc", "proofs_of_doc"]


@dataclass(frozen=True)
class UpdateProof:
    """The signed header's fields a window entry does not keep otherwise."""

    seqno: int
    signature: bytes
    membership: bytes = b""


def proof_of(signed: Signed) -> UpdateProof:
    header: UpdateHeader = signed.body
    return UpdateProof(header.seqno, signed.signature, header.membership)


def header_shapes(shapes: Mapping[str, tuple[int, ...]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """An update header's `shapes` field for a model (sorted by UTF-8 name)."""
    return tuple((name, tuple(int(d) for d in shapes[name])) for name in sorted(shapes, key=lambda n: n.encode()))


def check_entry(run_id: str, meta: UpdateMeta, codec: Codec, blob: str, size: int,
                shapes: Mapping[str, tuple[int, ...]], proof: UpdateProof | None) -> Signed:
    """The signed header an entry stands for, verified; `RemoteProtocolError(BAD_STATE)` if it carries no
    proof, the signature does not verify, or the rebuilt header's message id is not the entry's id."""
    from protocol import signing  # the signing module imports the wire schema: only when checking

    where = f"entry {meta.update_id.hex()[:12]} of {meta.origin[:16]}"
    if proof is None:
        raise RemoteProtocolError(Reason.BAD_STATE, f"{where} carries no signature")
    try:
        header = UpdateHeader(run_id, meta.origin, proof.seqno, meta.base_slot, meta.publish_slot, meta.tokens,
                              meta.inner_steps, str(codec), header_shapes(shapes), bytes.fromhex(blob), size,
                              proof.membership)
        signed = Signed(header, proof.signature)
        signing.verify(signed)
    except (RemoteProtocolError, LocalProtocolError, ValueError) as exc:
        raise RemoteProtocolError(Reason.BAD_STATE, f"{where}: its signature does not verify ({exc})") from None
    if signed.message_id != meta.update_id:
        raise RemoteProtocolError(Reason.BAD_STATE, f"{where}: its id is not the hash of the header it claims")
    return signed


def proofs_doc(proofs: Mapping[bytes, UpdateProof], ids: Iterable[bytes]) -> list[list[object]]:
    """The proofs of `ids` (where known) as plain msgpack-able lists, for a checkpoint's header."""
    return [[i, p.seqno, p.signature, p.membership] for i in sorted(ids) if (p := proofs.get(i)) is not None]


def proofs_of_doc(doc: object) -> dict[bytes, UpdateProof]:
    """`proofs_doc`'s value back (items of another form are skipped: a peer would refuse such an entry)."""
    out: dict[bytes, UpdateProof] = {}
    for item in doc if isinstance(doc, list | tuple) else ():
        if isinstance(item, list | tuple) and len(item) == 4 and isinstance(item[0], bytes) and isinstance(item[1], int):
            out[item[0]] = UpdateProof(item[1], bytes(item[2]), bytes(item[3]))
    return out
