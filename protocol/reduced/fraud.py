"""A fraud proof against a reduction, and the judgement every node reaches on it (PROTOCOL.md §15).

A checker whose re-reduction of the pieces it drew differs from the aggregator's reduction signs a
``reduced-fraud`` record: ``[slot, shard, reduction_id, piece]``, the reduction it accuses and the first
piece where they differ. It proves nothing by itself, since a hostile checker may sign one against an honest
aggregator. So every node judges it alike, from signed inputs only: it fetches the shard of every sealed
update (each checked against its origin's commitment), reduces the shard with the slot's coefficients and
scales, which it holds from the headers and the screen's partials, and compares the bytes with the accused
reduction's:

* they differ: the aggregator lied. The node's own reduction replaces the shard (the window is replayed),
  and the aggregator leaves later eligible sets;
* they are equal: the accuser lied. It leaves later eligible sets, and nothing is replaced.

So a false accusation costs its author its roles, and a true one gives every replica the same correct
values, with no node taking another's word. A judgement costs a node one shard of every sealed update,
about one update's bytes, once per proof, and a proven liar reduces no more shards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protocol.identity import Identity
from protocol.reduced.plan import ModelPiece, ShardPlan
from protocol.reduced.records import FRAUD, Record, sign_record
from protocol.reduced.slot import reduce_pieces

__all__ = ["Judgement", "first_difference", "judge", "make_fraud"]


def make_fraud(identity: Identity, slot: int, shard: int, reduction: Record, piece: int) -> Record:
    return sign_record(identity, FRAUD, [slot, shard, reduction.id, piece])


def first_difference(plan: ShardPlan, pieces: Sequence[ModelPiece], mine: bytes, theirs: bytes,
                     codec: str) -> int | None:
    """The index of the first of ``pieces`` whose bytes differ between two encodings of them (None: equal)."""
    for p in pieces:
        if plan.within(mine, pieces, [p], codec) != plan.within(theirs, pieces, [p], codec):
            return p.index
    return None


@dataclass(frozen=True)
class Judgement:
    """``lied``: the aggregator (True) or the accuser (False); ``shard``: the honest reduction's bytes."""

    lied: bool
    shard: bytes


def judge(plan: ShardPlan, shard: int, accused: bytes, values: Mapping[bytes, Mapping[int, np.ndarray]],
          coefficients: Mapping[str, Mapping[bytes, float]], scales: Mapping[str, float], codec: str) -> Judgement:
    """Judge a fraud proof against ``accused`` (the reduction's bytes of ``shard``, in ``codec``): ``values``
    are the sealed updates' pieces of the shard by update id, decoded from bytes checked against their
    commitments."""
    pieces = plan.shard(shard)
    honest = plan.encode(reduce_pieces(values, pieces, coefficients, scales), pieces, codec)
    return Judgement(honest != accused, honest)
