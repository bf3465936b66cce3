"""The signed records of a reduced run: an update's commitment, a slot's seal, an aggregator's screen
partials and its reduction, and a checker's fraud proof.

Each is a msgpack array of its fields (floats as 8-byte big-endian binary64, so the encoding stays
canonical: no msgpack floats), signed by its author with the run's one signing domain::

    signing_input = b"diloco/v1:" + kind + b":" + msgpack(fields)        id = SHA-256(signing_input)

so no record verifies as another kind or as a gossiped message (``protocol.signing``). PROTOCOL.md §15
gives the fields. :mod:`protocol.reduced.participant` signs and reads them; the node's gossip and blob planes
do not carry them yet.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import msgpack

from protocol.errors import Reason, RemoteProtocolError
from protocol.identity import Identity, verify_signature
from protocol.messages import DOMAIN

__all__ = ["COMMITMENT", "FRAUD", "PARTIALS", "RECORD_KINDS", "REDUCTION", "SEAL", "Record", "carried_record", "floats",
           "pack_floats", "sign_record"]

COMMITMENT, SEAL, PARTIALS, REDUCTION = b"reduced-commitment", b"reduced-seal", b"reduced-partials", b"reduced-reduction"
FRAUD = b"reduced-fraud"
RECORD_KINDS = frozenset({COMMITMENT, SEAL, PARTIALS, REDUCTION, FRAUD})


def pack_floats(values: Sequence[float]) -> bytes:
    return struct.pack(f">{len(values)}d", *values)


def floats(data: bytes) -> tuple[float, ...]:
    return struct.unpack(f">{len(data) // 8}d", data)


@dataclass(frozen=True)
class Record:
    """``fields`` of ``kind`` signed by ``author`` (a peer id)."""

    kind: bytes
    fields: tuple
    author: str
    signature: bytes

    @cached_property
    def body(self) -> bytes:
        return msgpack.packb(list(self.fields), use_bin_type=True)

    @cached_property
    def signing_input(self) -> bytes:
        return DOMAIN + b":" + self.kind + b":" + self.body

    @cached_property
    def id(self) -> bytes:
        return hashlib.sha256(self.signing_input).digest()

    @property
    def size(self) -> int:
        """Bytes on the wire: the body, the author's id and the signature."""
        return len(self.body) + len(self.author) + len(self.signature)

    def verify(self) -> None:
        """``RemoteProtocolError`` (BAD_IDENTITY, BAD_SIGNATURE) unless ``author`` signed it."""
        verify_signature(self.author, self.signature, self.signing_input)


def carried_record(kind: str, fields: bytes, author: str, signature: bytes) -> Record:
    """The record a gossiped ``ReducedRecord`` carries (``protocol.messages``): ``RemoteProtocolError``
    (BAD_SCHEMA) unless ``fields`` is a msgpack array that packs back to the same bytes (so that the
    signature covers what is read); the signature is checked by :meth:`Record.verify`."""
    try:
        values = msgpack.unpackb(fields, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, f"a record's fields: {e}") from None
    record = Record(kind.encode(), tuple(values) if isinstance(values, list) else (), author, signature)
    if not isinstance(values, list) or record.body != fields:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, "a record's fields are not a canonical msgpack array")
    return record


def sign_record(identity: Identity, kind: bytes, fields: Sequence) -> Record:
    unsigned = Record(kind, tuple(fields), identity.peer_id, b"")
    return Record(kind, tuple(fields), identity.peer_id, identity.sign(unsigned.signing_input))
