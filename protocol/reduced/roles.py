"""Who seals a slot and who reduces and checks each shard: orders every replica computes alike.

Each role of slot ``s`` ranks the slot's *eligible* origins (replicated state: those counted in sealed slot
``s − 2``, less any a fraud proof excluded) by ``SHA-256(role ‖ s ‖ peer)``; the first is the role's holder,
the next ones its successors when it does not act in time. A peer cannot choose its place in a later slot
(the slot number is in the hash), and every shard gets its own order, so the aggregator of shard ``k`` and
its checker are two different origins whenever two are eligible.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

__all__ = ["ranked", "reducers", "sealers"]


def _rank(role: bytes, slot: int, peer: str) -> bytes:
    return hashlib.sha256(role + b"\x00" + slot.to_bytes(8, "big") + peer.encode()).digest()


def ranked(role: bytes, slot: int, peers: Iterable[str]) -> list[str]:
    """``peers`` (distinct) in the order of ``SHA-256(role ‖ slot ‖ peer)``."""
    return sorted(set(peers), key=lambda p: _rank(role, slot, p))


def sealers(slot: int, eligible: Iterable[str]) -> list[str]:
    """Who may seal ``slot``, first the one whose seal wins."""
    return ranked(b"seal", slot, eligible)


def reducers(slot: int, shard: int, eligible: Iterable[str]) -> list[str]:
    """Shard ``shard`` of ``slot``: its aggregator first, its checker second, then the successors: the
    ``reduce`` order rotated by the shard, so that the eligible origins are dealt out one per shard (each
    reduces about ``S / |E|`` shards) and a shard's checker is the next shard's aggregator."""
    order = ranked(b"reduce", slot, eligible)
    if not order:
        return []
    k = shard % len(order)
    return order[k:] + order[:k]
