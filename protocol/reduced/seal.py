"""A slot's seal: the signed, closed set of the updates a reduced slot aggregates.

The sealer of slot ``s`` (:func:`protocol.reduced.roles.sealers`) signs the sorted ids it holds for ``s``,
at most ``cap`` of them: when more would-be contributors are due, those with the smallest
``SHA-256("admit" ‖ s ‖ id)`` (no origin chooses its place: the id is the hash of its signed header).
An update no seal of its slot holds goes to the next slot, one staleness later. Of two valid seals of one
slot, the one whose sealer comes first in the slot's order wins on every replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from protocol.errors import Reason, RemoteProtocolError
from protocol.identity import Identity
from protocol.reduced.records import SEAL, Record, sign_record
from protocol.reduced.roles import sealers

__all__ = ["Seal", "admitted", "make_seal", "winning_seal"]

ID = 32


def admitted(slot: int, ids: Iterable[bytes], cap: int | None) -> list[bytes]:
    """The ids a seal of ``slot`` holds of the candidates ``ids``: all, or the ``cap`` ranked first."""
    ids = sorted(set(ids))
    if cap is not None and len(ids) > cap:
        ids = sorted(sorted(ids, key=lambda i: hashlib.sha256(b"admit" + slot.to_bytes(8, "big") + i).digest())[:cap])
    return ids


@dataclass(frozen=True)
class Seal:
    """A checked seal: ``slot``, its ids ascending, the sealer and the record."""

    slot: int
    ids: tuple[bytes, ...]
    record: Record

    @property
    def sealer(self) -> str:
        return self.record.author

    @classmethod
    def read(cls, record: Record, eligible: Iterable[str], cap: int | None) -> Seal:
        """``RemoteProtocolError`` unless ``record`` is a seal signed by an eligible origin, its ids distinct,
        ascending and at most ``cap``."""
        if record.kind != SEAL or len(record.fields) != 2 or record.author not in set(eligible):
            raise RemoteProtocolError(Reason.BAD_SCHEMA, "not a seal by an origin eligible to seal")
        record.verify()
        slot, packed = record.fields
        if not isinstance(slot, int) or slot < 1 or not isinstance(packed, bytes) or len(packed) % ID:
            raise RemoteProtocolError(Reason.BAD_SCHEMA, "a seal is a slot ≥ 1 and whole ids")
        ids = tuple(packed[k:k + ID] for k in range(0, len(packed), ID))
        if list(ids) != sorted(set(ids)) or (cap is not None and len(ids) > cap):
            raise RemoteProtocolError(Reason.BAD_SCHEMA, "a seal's ids are distinct, ascending and at most the cap")
        return cls(slot, ids, record)


def make_seal(identity: Identity, slot: int, ids: Iterable[bytes], cap: int | None) -> Record:
    return sign_record(identity, SEAL, [slot, b"".join(admitted(slot, ids, cap))])


def winning_seal(seals: Sequence[Seal], eligible: Iterable[str]) -> Seal:
    """The seal whose sealer comes first in its slot's order (all of one slot)."""
    slot = seals[0].slot
    order = {p: k for k, p in enumerate(sealers(slot, eligible))}
    return min(seals, key=lambda s: (order[s.sealer], s.record.id))
