"""A sealed slot's aggregate, computed in pieces: what contributors commit to, what aggregators exchange and
publish, and the same coefficients and scales the all-to-all ledger computes.

**Commitments.** A contributor signs, with its update's header, the Merkle root of its payload's pieces
(:mod:`protocol.reduced.merkle`) and each piece's binary64 norm² (numpy's pairwise sum of the piece's squares, as
``protocol.ledger.chunks.tensor_norm`` takes it per chunk). Every replica then has every update's tensor
norms from headers alone, bit for bit those of the decoded payload: a piece is a chunk of the canonical
chunking, and a tensor's norm is the ``fsum`` of its chunks'.

**Terms.** A slot's *header entries* (:func:`header_entry`) carry norms, weights and the commitment, not
values, so :func:`protocol.ledger.aggregate.tensor_terms` gives every coefficient before the direction
screen from headers. The screen reads :class:`~protocol.ledger.aggregate.ScreenSums`, which are ``fsum``\\ s
over a tensor's chunks of per-chunk sums (:func:`~protocol.ledger.aggregate.span_screen_sums`): each
aggregator computes them over its own pieces and publishes them (:func:`piece_partials`), and
:class:`PartialScreen` adds the published partials of every piece of the tensor. The screen's decision, the
coefficients and the radial scale ``s`` are therefore bit for bit those of an all-to-all slot holding the
same set, and the same on every aggregator that gathered the same partials.

**Reductions.** The aggregator of a shard sums ``U = Σ c_i x_i`` over each of its pieces in id order (the
canonical accumulation) and publishes ``g = s · U`` rounded to binary32, encoded in the run's codec
(:func:`reduce_pieces`). Every node applies the decoded values: all replicas step with the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from protocol.errors import Reason, RemoteProtocolError
from protocol.identity import Identity
from protocol.kernels import accumulate_term
from protocol.ledger.aggregate import LiveTerms, ScreenCache, ScreenSums, SlotEntry, span_screen_sums, tensor_terms
from protocol.ledger.config import LedgerConfig, UpdateMeta
from protocol.ledger.weights import update_weight
from protocol.reduced import merkle
from protocol.reduced.plan import ModelPiece, ShardPlan
from protocol.reduced.records import COMMITMENT, Record, floats, pack_floats, sign_record

__all__ = ["Commitment", "HeaderDeltas", "PartialScreen", "PiecePartials", "commit", "header_entry",
           "piece_leaves", "piece_norms2", "piece_partials", "pieces_proof", "reduce_pieces", "slot_terms"]

_F64 = np.float64
#: A piece's share of a set's screen sums: ``‖U‖²``, ``⟨x_i, U⟩`` in the set's id order, and the pair product.
PiecePartials = tuple[float, list[float], float | None]


def piece_norms2(plan: ShardPlan, values: Mapping[str, np.ndarray]) -> list[float]:
    """Each piece's norm² (float64 pairwise sum of squares) of the float32 tensors ``values``."""
    out = []
    for p in plan.pieces:
        x = np.asarray(values[p.name], dtype=np.float32).reshape(-1)[p.start:p.stop]
        out.append(float(np.sum(np.square(x, dtype=_F64))))
    return out


def piece_leaves(plan: ShardPlan, payload: bytes, codec: str) -> list[bytes]:
    """The Merkle leaves of ``payload``'s pieces (:mod:`protocol.reduced.merkle`)."""
    return [merkle.leaf(b) for b in plan.piece_bytes(payload, codec)]


def pieces_proof(leaves: Sequence[bytes], pieces: Sequence[ModelPiece]) -> list[bytes]:
    """The Merkle proof served with ``pieces`` (contiguous: a shard's, or one piece) of a payload of ``leaves``."""
    return merkle.range_proof(leaves, pieces[0].index, pieces[-1].index + 1)


def commit(identity: Identity, meta: UpdateMeta, plan: ShardPlan, payload: bytes, codec: str,
           values: Mapping[str, np.ndarray]) -> Record:
    """The origin's signed commitment to ``payload`` (whose decode is ``values``): update id, the Merkle root
    of its pieces, each piece's norm²."""
    return sign_record(identity, COMMITMENT, [meta.update_id, merkle.root(piece_leaves(plan, payload, codec)),
                                              pack_floats(piece_norms2(plan, values))])


class Commitment:
    """A checked commitment: the pieces' Merkle root and the piece norms² an origin signed for one update."""

    def __init__(self, record: Record, meta: UpdateMeta, plan: ShardPlan) -> None:
        if record.kind != COMMITMENT or record.author != meta.origin or len(record.fields) != 3:
            raise RemoteProtocolError(Reason.BAD_SCHEMA, "not a commitment by the update's origin")
        record.verify()
        update_id, tree, norms2 = record.fields
        if update_id != meta.update_id or not isinstance(tree, bytes) or len(tree) != 32 \
                or not isinstance(norms2, bytes) or len(norms2) != 8 * len(plan.pieces):
            raise RemoteProtocolError(Reason.BAD_SCHEMA, "a commitment's root or norms do not fit the run's pieces")
        self.record, self.meta, self.root, self.count = record, meta, tree, len(plan.pieces)
        self.norms2 = floats(norms2)
        if not all(math.isfinite(x) and x >= 0.0 for x in self.norms2):
            raise RemoteProtocolError(Reason.NON_FINITE, "a commitment's norms² must be finite and ≥ 0")
        self.key = tree  # equal for bit-identical payloads (copies)

    def check_pieces(self, first: int, parts: Sequence[bytes], proof: Sequence[bytes]) -> None:
        """``RemoteProtocolError`` unless ``parts`` are the bytes of pieces ``first, first + 1, …`` this
        commitment names (``proof``: their Merkle proof, served with them)."""
        if not merkle.verify_range(self.root, self.count, first, [merkle.leaf(b) for b in parts], proof):
            raise RemoteProtocolError(Reason.BAD_STATE, f"pieces {first}.. of {self.meta.update_id.hex()[:12]} are "
                                                        "not the ones its origin committed to")


class HeaderDeltas(Mapping[str, np.ndarray]):
    """A header entry's stand-in for deltas: the shapes, and no values (an aggregator reads its pieces)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        self.shapes = dict(shapes)

    def __getitem__(self, name: str) -> np.ndarray:
        raise KeyError(f"a header entry holds no values of {name!r}")

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def header_entry(commitment: Commitment, plan: ShardPlan, slot: int, config: LedgerConfig) -> SlotEntry:
    """The entry of ``commitment``'s update sealed at ``slot``: weight by its header and ``slot``, each tensor's
    norm from the committed norms² of its pieces."""
    parts: dict[str, list[float]] = {name: [] for name in plan.shapes}
    for p, n2 in zip(plan.pieces, commitment.norms2, strict=True):
        parts[p.name].append(n2)
    norms = {name: math.sqrt(math.fsum(v)) for name, v in parts.items()}
    return SlotEntry(commitment.meta, slot, update_weight(commitment.meta, slot, config), HeaderDeltas(plan.shapes),
                     norms, commitment=commitment.key)


def _accumulate(xs: Sequence[np.ndarray], cs: Sequence[float], out: np.ndarray) -> None:
    """``out = Σ c_k x_k`` in the given order, as the aggregate's canonical ``U`` (``+0`` with no term)."""
    for k, (x, c) in enumerate(zip(xs, cs, strict=True)):
        accumulate_term(out, x, _F64(c), k == 0)
    if not xs:
        out[...] = 0.0


def piece_partials(values: Mapping[bytes, Mapping[int, np.ndarray]], live: Sequence[tuple[bytes, float]],
                   pieces: Sequence[ModelPiece]) -> dict[int, PiecePartials]:
    """Each of ``pieces``' share of the screen sums of ``live`` (``(update id, c)`` in id order), from the
    pieces' float32 values by update id and piece index."""
    out = {}
    for p in pieces:
        uc, tmp = np.empty(p.size, dtype=_F64), np.empty(p.size, dtype=_F64)
        xs = [values[i][p.index] for i, _ in live]
        _accumulate(xs, [c for _, c in live], uc)
        out[p.index] = span_screen_sums(uc, xs, tmp)
    return out


class PartialScreen(ScreenCache):
    """Screen sums from published piece partials: ``gather(name, live)`` returns the partials of every piece
    of tensor ``name`` for the set ``live`` (``(update id, c)``), in piece order; their ``fsum`` is the set's
    canonical :class:`ScreenSums`."""

    def __init__(self, gather: Callable[[str, list[tuple[bytes, float]]], Sequence[PiecePartials]]) -> None:
        super().__init__()
        self._gather = gather

    def sums(self, name: str, live: LiveTerms) -> ScreenSums:
        known = self.get(name, live)
        if known is None:
            terms = [(e.meta.update_id, float(c)) for e, c in live]
            parts = self._gather(name, terms)
            known = ScreenSums(u_squared=math.fsum(p[0] for p in parts),
                               along={i: math.fsum(p[1][k] for p in parts) for k, (i, _) in enumerate(terms)},
                               pair=math.fsum(p[2] for p in parts) if len(terms) == 2 else None)
            self.put(name, live, known)
        return known


def slot_terms(entries: Sequence[SlotEntry], name: str, config: LedgerConfig, screen: PartialScreen
               ) -> tuple[dict[bytes, float], float]:
    """Tensor ``name``'s coefficients (by id, nonzero only) and scale ``s`` for a sealed slot of ``entries``."""
    terms = tensor_terms(entries, name, config, screen)
    live = [(e, c) for e in sorted(entries, key=lambda e: e.meta.update_id)
            if (c := terms.coefficients[e.meta.update_id]) != 0.0]
    norm = math.sqrt(screen.sums(name, live).u_squared) if terms.radial and live else 0.0
    return {e.meta.update_id: c for e, c in live}, terms.scale(norm)


def reduce_pieces(values: Mapping[bytes, Mapping[int, np.ndarray]], pieces: Sequence[ModelPiece],
                  coefficients: Mapping[str, Mapping[bytes, float]], scales: Mapping[str, float]
                  ) -> dict[int, np.ndarray]:
    """``g = s · Σ c_i x_i`` of each of ``pieces`` (ids ascending), rounded to binary32."""
    out = {}
    for p in pieces:
        cs = sorted(coefficients[p.name].items())
        uc = np.empty(p.size, dtype=_F64)
        _accumulate([values[i][p.index] for i, _ in cs], [c for _, c in cs], uc)
        uc *= _F64(scales[p.name])
        out[p.index] = uc.astype(np.float32)
    return out
