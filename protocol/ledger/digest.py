"""Digests of the ledger (which update ids were applied at which slot) and of parameter arrays.

All are SHA-256 over a domain-separated canonical encoding:

* slot digest: ``"diloco/ledger-slot/v1\\0" ‖ slot (u64 BE) ‖ count (u32 BE) ‖ sorted ids``;
* chain: slots that have left the window are folded, in slot order, into
  ``chain_s = H("diloco/ledger-chain/v1\\0" ‖ chain_{s−1} ‖ slot_digest_s)`` starting from ``GENESIS``;
* ledger digest: ``H("diloco/ledger/v2\\0" ‖ closed slots n (u64 BE) ‖ chain ‖ finalized tokens (u128 BE) ‖
  finalized placement sum (40 bytes BE) ‖ slot digests of the window and the open slot, in slot order)`` —
  equal exactly when the same ids were applied at the same slots, the same number of slots were closed
  and the same totals were finalized (up to SHA-256 collisions): the totals the fork choice weighs are
  inside every signed digest, never only a donor's word;
* array digest: ``H(domain ‖ for each name in sorted order: len ‖ utf-8 name ‖ dtype ‖ ndim ‖ shape ‖ raw
  little-endian C-order bytes)``;
* tree digest: the same, with the raw bytes of each array replaced by the concatenated SHA-256 of its
  consecutive ``PIECE``-byte pieces (the last one shorter): one level of hash tree, so pieces are hashed
  in parallel threads (hashlib releases the GIL) and a piece can be checked alone;
* state digest: ``H("diloco/ledger-state/v2\0" ‖ tree digest of the window bottom (domain
  "diloco/bottom/v2\0", arrays "theta/<name>" and "momentum/<name>" as float32) ‖ ledger digest)``: the
  canonical state ``θ_n, v_n`` is a function of the bottom and the window's sets, so equal state digests
  mean equal canonical parameters and momentum, bit for bit. Its cost is one hash of the bottom (8
  bytes per parameter) per slot that leaves the window, made by the ledger in the same pass that steps
  the bottom (each tensor hashed right after it is stepped), never a replay and never on a request.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from protocol.parallel import parallel_map

__all__ = ["BOTTOM_DOMAIN", "GENESIS", "PIECE", "Row", "array_digest", "chain_next", "ledger_digest", "piece_hashes",
           "slot_digest", "state_digest", "tree_digest", "tree_digest_of_hashes", "tree_row", "tree_rows"]

#: Bytes per hashed piece of an array in a tree digest (part of the digest's definition).
PIECE = 1 << 22

GENESIS = hashlib.sha256(b"diloco/ledger-genesis/v1").digest()
#: The domain of the window bottom's tree digest (the state digest's first part).
BOTTOM_DOMAIN = b"diloco/bottom/v2\0"


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


def ledger_digest(closed_slots: int, chain: bytes, finalized_tokens: int, finalized_placement: bytes,
                  slot_digests: Iterable[bytes]) -> bytes:
    """Digest of a whole ledger: finalized chain and totals, plus the live slots' digests in slot order."""
    h = hashlib.sha256(b"diloco/ledger/v2\0")
    h.update(closed_slots.to_bytes(8, "big"))
    h.update(chain)
    h.update(finalized_tokens.to_bytes(16, "big"))
    h.update(finalized_placement)
    for d in slot_digests:
        h.update(d)
    return h.digest()


def _piece_hash(piece: memoryview) -> bytes:
    return hashlib.sha256(piece).digest()


def _header(h: "hashlib._Hash", name: str, dtype: str, shape: tuple[int, ...]) -> None:
    raw_name = name.encode("utf-8")
    h.update(len(raw_name).to_bytes(4, "big") + raw_name)
    h.update(dtype.encode("ascii") + len(shape).to_bytes(1, "big"))
    for dim in shape:
        h.update(dim.to_bytes(8, "big"))


def _little_endian(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))


def piece_hashes(a: np.ndarray) -> list[bytes]:
    """The SHA-256 of each ``PIECE``-byte piece of ``a``'s raw little-endian C-order bytes (the last piece
    shorter; none for an empty array), hashed in parallel threads."""
    view = memoryview(_little_endian(a)).cast("B")
    return parallel_map(_piece_hash, [view[i : i + PIECE] for i in range(0, view.nbytes, PIECE)])


def tree_digest_of_hashes(rows: Iterable[tuple[str, str, tuple[int, ...], Iterable[bytes]]], domain: bytes) -> bytes:
    """The tree digest from ``(name, dtype string, shape, piece hashes)`` rows in ascending name order: what
    :func:`tree_digest` computes from the arrays, for a reader that holds only the hashes (a joiner)."""
    h = hashlib.sha256(domain)
    for name, dtype, shape, hashes in rows:
        _header(h, name, dtype, tuple(shape))
        for piece_hash in hashes:
            h.update(piece_hash)
    return h.digest()


Row = tuple[str, str, tuple[int, ...], tuple[bytes, ...]]  # (name, dtype string, shape, piece hashes)


def tree_row(name: str, a: np.ndarray) -> Row:
    """One array's row of a tree digest (its pieces hashed in parallel threads, or serially when called from
    one of them)."""
    a = np.asarray(a)
    return name, a.dtype.newbyteorder("<").str, tuple(a.shape), tuple(piece_hashes(a))


def tree_rows(arrays: Mapping[str, np.ndarray], after: Callable[[np.ndarray], None] | None = None) -> list[Row]:
    """The rows a tree digest is computed from, in ascending name order: each array's pieces hashed in
    parallel threads; ``after(array)`` is called once each array is hashed (e.g. to let the pages of a
    memory-mapped one go)."""
    rows = []
    for name in sorted(arrays):
        rows.append(tree_row(name, arrays[name]))
        if after is not None:
            after(arrays[name])
    return rows


def tree_digest(
    arrays: Mapping[str, np.ndarray], domain: bytes, after: Callable[[np.ndarray], None] | None = None
) -> bytes:
    """Digest of named arrays over the SHA-256 of their ``PIECE``-byte pieces (module docstring;
    :func:`tree_rows`, then :func:`tree_digest_of_hashes`)."""
    return tree_digest_of_hashes(tree_rows(arrays, after), domain)


def state_digest(bottom_digest: bytes, ledger: bytes) -> bytes:
    """The state digest (module docstring) from the bottom's tree digest and the ledger digest."""
    return hashlib.sha256(b"diloco/ledger-state/v2\0" + bottom_digest + ledger).digest()


def array_digest(arrays: Mapping[str, np.ndarray], domain: bytes = b"diloco/arrays/v1\0") -> bytes:
    """Digest of named arrays over their exact bytes (little-endian, C order)."""
    h = hashlib.sha256(domain)
    for name in sorted(arrays):
        a = _little_endian(arrays[name])
        _header(h, name, a.dtype.str, a.shape)
        h.update(memoryview(a).cast("B"))
    return h.digest()
