"""A binary SHA-256 Merkle tree over a payload's pieces: the commitment signs its root (32 bytes, whatever the
number of pieces); an aggregator gets its shard's pieces, a contiguous range of leaves, with the range's
proof (:func:`range_proof`: at most two nodes a level), and a judge of a fraud proof one piece with its own.

Leaves are ``SHA-256(b"\\x00" ‖ piece bytes)``, inner nodes ``SHA-256(b"\\x01" ‖ left ‖ right)`` (the prefixes
keep a leaf from passing for a node); a level of odd length carries its last node up unpaired.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["leaf", "range_proof", "root", "verify_range"]


def leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _parent(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    levels = [list(leaves)]
    while len(levels[-1]) > 1:
        below = levels[-1]
        levels.append([_parent(below[i], below[i + 1]) if i + 1 < len(below) else below[i]
                       for i in range(0, len(below), 2)])
    return levels


def root(leaves: Sequence[bytes]) -> bytes:
    return _levels(leaves)[-1][0]


def range_proof(leaves: Sequence[bytes], lo: int, hi: int) -> list[bytes]:
    """The nodes the root needs besides leaves ``[lo, hi)``, level by level from the leaves up, at each
    level the left one before the right one."""
    out = []
    for level in _levels(leaves)[:-1]:
        if lo % 2:
            out.append(level[lo - 1])
        if hi % 2 and hi < len(level):
            out.append(level[hi])
        lo, hi = lo // 2, (hi + 1) // 2
    return out


def verify_range(root_hash: bytes, count: int, lo: int, leaf_hashes: Sequence[bytes], proof: Sequence[bytes]) -> bool:
    """Whether ``leaf_hashes`` are leaves ``lo, lo + 1, …`` of ``count`` under ``root_hash`` by ``proof``."""
    hi = lo + len(leaf_hashes)
    if not 0 <= lo < hi <= count:
        return False
    nodes, width, used = list(leaf_hashes), count, 0
    while width > 1:
        if lo % 2:
            if used == len(proof):
                return False
            nodes.insert(0, proof[used])
            used, lo = used + 1, lo - 1
        if hi % 2 and hi < width:
            if used == len(proof):
                return False
            nodes.append(proof[used])
            used, hi = used + 1, hi + 1
        nodes = [_parent(nodes[i], nodes[i + 1]) if i + 1 < len(nodes) else nodes[i] for i in range(0, len(nodes), 2)]
        lo, hi, width = lo // 2, (hi + 1) // 2, (width + 1) // 2
    return used == len(proof) and nodes == [root_hash]
