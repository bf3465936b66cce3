"""A binary SHA-256 Merkle tree over a payload's shard hashes: the header signs its root (32 bytes, whatever
the number of shards), an aggregator gets its shard's path with the shard's bytes.

Leaves are ``SHA-256(b"\\x00" ‖ shard bytes)``, inner nodes ``SHA-256(b"\\x01" ‖ left ‖ right)`` (the prefixes
keep a leaf from passing for a node); a level of odd length carries its last node up unpaired.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["leaf", "path", "root", "verify_path"]


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


def path(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """The siblings from leaf ``index`` up to the root (an unpaired node has none at its level)."""
    out = []
    for level in _levels(leaves)[:-1]:
        sibling = index ^ 1
        if sibling < len(level):
            out.append(level[sibling])
        index //= 2
    return out


def verify_path(root_hash: bytes, count: int, index: int, leaf_hash: bytes, siblings: Sequence[bytes]) -> bool:
    """Whether ``leaf_hash`` is leaf ``index`` of ``count`` under ``root_hash`` by ``siblings``."""
    if not 0 <= index < count:
        return False
    node, width, used = leaf_hash, count, 0
    while width > 1:
        if index ^ 1 < width:
            if used == len(siblings):
                return False
            node = _parent(siblings[used], node) if index & 1 else _parent(node, siblings[used])
            used += 1
        index, width = index // 2, (width + 1) // 2
    return used == len(siblings) and node == root_hash
