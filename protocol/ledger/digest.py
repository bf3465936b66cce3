"""Digests of the ledger (which update ids were applied at which slot) and of parameter arrays.

All are SHA-256 over a domain-separated canonical encoding:

* slot digest: ``"diloco/ledger-slot/v1\\0" ‖ slot (u64 BE) ‖ count (u32 BE) ‖ sorted ids``;
* chain: slots that have left the window are folded, in slot order, into
  ``chain_s = H("diloco/ledger-chain/v1\\0" ‖ chain_{s−1} ‖ slot_digest_s)`` starting from ``GENESIS``;
* ledger digest: ``H("diloco/ledger/v1\\0" ‖ closed slots n (u64 BE) ‖ chain ‖ slot digests of the window
  and the open slot, in slot order)`` — equal exactly when the same ids were applied at the same slots
  and the same number of slots were closed (up to SHA-256 collisions);
* array digest: ``H(domain ‖ for each name in sorted order: len ‖ utf-8 name ‖ dtype ‖ ndim ‖ shape ‖ raw
  little-endian C-order bytes)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["GENESIS", "array_digest", "chain_next", "ledger_digest", "slot_digest"]

GENESIS = hashlib.sha256(b"diloco/ledger-genesis/v1").digest()


def slot_digest(slot: int, ids: Iterable[bytes]) -> bytes:
    """Digest of the set of update ids applied at ``slot``."""
    ordered = sorted(ids)
    h = hashlib.sha256(b"diloco/ledger-slot/v1\0")
    h.update(slot.to_bytes(8, "big"))
    h.update(len(ordered).to_bytes(4, "big"))
    for update_id in ordered:
        h.update(update_id)
    return h.digest()


def chain_next(chain: bytes, digest_of_slot: bytes) -> bytes:
    """Fold one finalized slot's digest into the chain."""
    return hashlib.sha256(b"diloco/ledger-chain/v1\0" + chain + digest_of_slot).digest()


def ledger_digest(closed_slots: int, chain: bytes, slot_digests: Iterable[bytes]) -> bytes:
    """Digest of a whole ledger: finalized chain plus the live slots' digests in slot order."""
    h = hashlib.sha256(b"diloco/ledger/v1\0")
    h.update(closed_slots.to_bytes(8, "big"))
    h.update(chain)
    for d in slot_digests:
        h.update(d)
    return h.digest()


def array_digest(arrays: Mapping[str, np.ndarray], domain: bytes = b"diloco/arrays/v1\0") -> bytes:
    """Digest of named arrays over their exact bytes (little-endian, C order)."""
    h = hashlib.sha256(domain)
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        a = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        raw_name = name.encode("utf-8")
        h.update(len(raw_name).to_bytes(4, "big") + raw_name)
        h.update(a.dtype.str.encode("ascii") + a.ndim.to_bytes(1, "big"))
        for dim in a.shape:
            h.update(dim.to_bytes(8, "big"))
        h.update(memoryview(a).cast("B"))
    return h.digest()
