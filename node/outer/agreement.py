"""The agreement hash: what two replicas compare to know they hold the same state (the drain, `node.sync.drain`).

`IdSetHash` is an order-independent hash of a set of update ids (the ledger's seen set: applied, held,
dropped or orphaned), kept up to date one id at a time. `agreement_hex` combines it with the ledger's
placement sum (which update sits at which slot, `protocol.ledger.fork`): two replicas with the same seen
ids and the same placements have the same agreement hash, whatever order things arrived in and however many
slots each has closed, and replicas whose histories forked keep differing there until the fork choice has
reconciled them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["IdSetHash", "agreement_hex"]


class IdSetHash:
    """Sum modulo 2^256 of SHA-256("diloco/idset/v1\\0" || id) over a set of 32-byte ids."""

    _MOD = 1 << 256

    def __init__(self, ids: Iterable[bytes] = ()) -> None:
        self.value = 0
        self.count = 0
        for i in ids:
            self.add(i)

    def add(self, update_id: bytes) -> None:
        h = hashlib.sha256(b"diloco/idset/v1\0" + update_id).digest()
        self.value = (self.value + int.from_bytes(h, "big")) % self._MOD
        self.count += 1

    def hex(self, chars: int = 64) -> str:
        return self.value.to_bytes(32, "big").hex()[:chars]


def agreement_hex(seen_hash: IdSetHash, placement: int) -> str:
    """The agreement hash of a state: SHA-256 of its seen-id set hash and its placement sum."""
    seen = seen_hash.value.to_bytes(32, "big")
    return hashlib.sha256(b"diloco/agreement/v1\0" + seen + (placement % (1 << 256)).to_bytes(32, "big")).hexdigest()
