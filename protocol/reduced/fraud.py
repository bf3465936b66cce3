"""A fraud proof against a reduction, and the judgement every node reaches on it (PROTOCOL.md §15).

A checker whose re-reduction of the pieces it drew differs from the aggregator's reduction signs a
``reduced-fraud`` record: ``[slot, shard, reduction_id, piece]``, the reduction it accuses and the first
piece where they differ. It proves nothing by itself, since a hostile checker may sign one against an honest
aggregator. So every node judges it alike, from signed inputs only: it fetches that piece of every sealed
update, each with its Merkle proof against its origin's commitment, reduces the piece with the slot's
coefficients and scales (which it holds from the headers and the screen's partials), and compares the
bytes with the accused reduction's for that piece:

* they differ: the aggregator lied, and leaves later eligible sets. The checker, proven right, reduces the
  whole shard and publishes it; that reduction replaces the lie on every replica (the window is replayed),
  held to the same norm bound as any;
* they are equal: the accuser lied. It leaves later eligible sets, and nothing is replaced.

So a false accusation costs its author its roles, a true one its target's, and no node takes another's word
for which. A judgement costs a node one piece of every sealed update (``U / P`` each, for ``P`` pieces in
the model), once per proof.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from protocol.identity import Identity
from protocol.reduced.plan import ModelPiece, ShardPlan
from protocol.reduced.records import FRAUD, Record, sign_record
from protocol.reduced.slot import reduce_pieces

__all__ = ["first_difference", "judge", "make_fraud"]


def make_fraud(identity: Identity, slot: int, shard: int, reduction: Record, piece: int) -> Record:
    return sign_record(identity, FRAUD, [slot, shard, reduction.id, piece])


def first_difference(plan: ShardPlan, pieces: Sequence[ModelPiece], mine: bytes, theirs: bytes,
                     codec: str) -> int | None:
    """The index of the first of ``pieces`` whose bytes differ between two encodings of them (None: equal)."""
    for p in pieces:
        if plan.within(mine, pieces, [p], codec) != plan.within(theirs, pieces, [p], codec):
            return p.index
    return None


def judge(plan: ShardPlan, piece: ModelPiece, accused: bytes, values: Mapping[bytes, Mapping[int, np.ndarray]],
          coefficients: Mapping[str, Mapping[bytes, float]], scales: Mapping[str, float], codec: str) -> bool:
    """Whether the reduction whose bytes for ``piece`` are ``accused`` (in ``codec``) lied: ``values`` are the
    sealed updates' values of ``piece`` by update id, decoded from bytes checked against their commitments."""
    return plan.encode(reduce_pieces(values, [piece], coefficients, scales), [piece], codec) != accused
