"""`--misbehave` on a node of a reduced run (`--traffic reduced`), kept apart from the honest code paths.

- `LyingNode` (`--misbehave lie`): a participant whose reductions are not the honest ones: every shard it
  reduces (as the shard's aggregator, or replacing one) is published as its honest reduction times `factor`
  (−1: negated; the same norm, so the headers' norm bound passes it and only a check finds it). The
  shard's checker re-reduces pieces by its own coin, finds the difference and signs a fraud proof; every node
  then excludes the liar and steps with the checker's reduction instead (PROTOCOL.md §15).
- `ReducedPoison` (`--misbehave poison:KIND`): a contributor publishing, every round, `node.chaos.Poison`'s
  hostile update instead of its own, re-encoded in the run's codec (a reduced run's commitments are in it);
  the honest replicas' defence is the same norm bound and direction screen as all-to-all, applied to the
  sealed set's headers and partials, and the claim bound (`tokens`: refused as `bad_claim`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from node.chaos import Poison
from protocol.compression import decode_tensors, encode_tensors
from protocol.ledger.config import LedgerConfig
from protocol.reduced.participant import ReducedNode

__all__ = ["LIE_FACTOR", "LyingNode", "ReducedPoison", "unbounded"]

LIE_FACTOR = -1.0  # `--misbehave lie`: every reduction negated


class LyingNode(ReducedNode):
    """A participant whose reductions are its honest ones (as the run's codec rounds them) times ``factor``;
    honest while ``factor`` is None (the in-process harness sets it for the slots it lies in)."""

    factor: float | None = None

    def _reduction_values(self, k, coefficients, scales):
        values = super()._reduction_values(k, coefficients, scales)
        if self.factor is None:
            return values
        pieces = self.plan.shard(k)
        honest = self.plan.decode(self.plan.encode(values, pieces, self.reduction_codec), pieces, self.reduction_codec)
        return {i: (x * np.float32(self.factor)).astype(np.float32) for i, x in honest.items()}


def unbounded(config: LedgerConfig) -> LedgerConfig:
    """The ledger configuration of a hostile node that does not hold its own claims to the run's bound (so
    its participant publishes a 2⁴⁰-token claim that every honest one refuses)."""
    return dataclasses.replace(config, tokens_per_step=None, max_inner_steps=None)


class ReducedPoison:
    """`Poison(kind)` in a reduced run: `apply` turns the round's payload (the run's codec) into the hostile
    one, in the same codec, with the tokens and inner steps it claims."""

    def __init__(self, kind: str, shapes, codec: str, tokens_per_step: int, max_steps: int) -> None:
        self.poison, self.shapes, self.codec = Poison(kind, shapes, tokens_per_step, max_steps), dict(shapes), codec

    def apply(self, payload: bytes, target_slot: int) -> tuple[bytes, int, int]:
        data, codec, tokens, steps = self.poison.apply(payload, self.codec, target_slot)
        hostile = decode_tensors(data, codec, self.shapes)
        return encode_tensors(hostile, self.codec), tokens, steps
