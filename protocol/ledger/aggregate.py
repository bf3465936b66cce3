"""A slot's aggregate: a function of the *set* of updates applied at the slot.

Per tensor, with weights ``w_i`` and pseudo-gradients ``Δ_i``, the aggregate is ``g = s · U`` where
``U = Σ c_i Δ_i`` is a float64 accumulator with per-update coefficients ``c_i`` (:func:`coefficient`) and
``s`` a per-slot scale (:func:`slot_scale`):

* mean: ``c_i = w_i``, ``s = 1 / Σ w_i`` — the weighted average;
* radial-directional (every tensor except the configured embeddings): ``c_i = w_i / ‖Δ_i‖`` (0 for a zero
  update), ``s = (Σ w_i ‖Δ_i‖ / Σ w_i) / ‖U‖`` — the weighted mean norm times the normalized weighted mean
  direction. ``U = 0`` gives ``g = 0``; an empty slot aggregates to zeros.

Because ``c_i`` depends on the update alone, a kept sum ``U`` takes a late update in one pass (the fold,
``protocol.ledger.outer.fold_change``; :func:`norm_with_term` gives its norm first), not a
recomputation; such a sum depends on the arrival order in the last bits. The *canonical* value
(:func:`canonical_spans`, :func:`accumulate_sorted`) visits entries in ascending ``update_id`` order and is
bit-identical on every replica holding the same set (scalar sums use ``math.fsum``; norms use numpy's
pairwise summation over fixed chunks, never BLAS; terms with ``c_i = 0`` are skipped).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protocol.ledger.chunks import CHUNK, flat, spans
from protocol.parallel import parallel_map
from protocol.ledger.config import Aggregation, LedgerConfig, UpdateMeta
from protocol.ledger.payload import Payload, span_of

__all__ = ["SlotEntry", "accumulate_sorted", "aggregate", "canonical_spans", "coefficient", "norm_with_term",
           "slot_scale", "uses_radial"]

_F64 = np.float64


@dataclass(frozen=True)
class SlotEntry:
    """One update applied (or held) at ``slot``: its header, weight, deltas, the float64 norm of every
    tensor, and the encoded payload the deltas decode from, when the caller had one. The deltas are then
    that payload (:class:`~protocol.ledger.payload.PayloadDeltas`, decoded span by span when read), else
    read-only C-contiguous float32 arrays."""

    meta: UpdateMeta
    slot: int
    weight: float
    deltas: Mapping[str, np.ndarray]
    norms: Mapping[str, float]
    payload: Payload | None = None


def uses_radial(name: str, config: LedgerConfig) -> bool:
    """Whether tensor ``name`` is aggregated radial-directionally under ``config``."""
    return config.aggregation is Aggregation.RADIAL_DIRECTIONAL and name not in config.embeddings


def coefficient(entry: SlotEntry, name: str, config: LedgerConfig) -> float:
    """``c_i`` of ``entry`` for tensor ``name`` (independent of the other entries of the slot)."""
    if not uses_radial(name, config):
        return entry.weight
    norm = entry.norms[name]
    return entry.weight / norm if norm > 0.0 else 0.0


def slot_scale(entries: Sequence[SlotEntry], name: str, config: LedgerConfig, u_norm: float) -> float:
    """``s`` for tensor ``name`` of a slot holding ``entries`` whose accumulator has norm ``u_norm``."""
    if not entries:
        return 0.0
    total = math.fsum(e.weight for e in sorted(entries, key=lambda e: e.meta.update_id))
    if not uses_radial(name, config):
        return 1.0 / total
    if u_norm <= 0.0:
        return 0.0
    mean_norm = (
        math.fsum(e.weight * e.norms[name] for e in sorted(entries, key=lambda e: e.meta.update_id)) / total
    )
    return mean_norm / u_norm


def _buffer(size: int) -> np.ndarray:
    return np.empty(min(CHUNK, size), dtype=_F64)


def norm_with_term(u: np.ndarray, x: np.ndarray, c: float) -> float:
    """``‖u + c·x‖`` in float64 (canonical chunking), ``u`` float64 or a float32 kept sum, ``x`` float32;
    nothing is written."""
    uf, xf, buf = flat(u), flat(x), _buffer(u.size)
    cc = _F64(c)
    parts = []
    for s in spans(uf.size):
        t = buf[: s.stop - s.start]
        np.multiply(xf[s], cc, out=t, dtype=_F64)
        t += uf[s]
        parts.append(float(np.sum(np.square(t, out=t))))
    return math.sqrt(math.fsum(parts))


def canonical_spans(
    entries: Sequence[SlotEntry], name: str, config: LedgerConfig, size: int, out: np.ndarray | None = None
) -> Iterator[tuple[slice, np.ndarray, float]]:
    """Tensor ``name``'s canonical ``U`` over ``entries``, span by span (the fixed chunking): yields
    ``(span, U over it, its sum of squares)``. ``U`` is written into ``out`` (a flat float64 array of
    ``size``) if given, else into one chunk-sized buffer reused for the next span."""
    ordered = sorted(entries, key=lambda e: e.meta.update_id)
    terms = [(e.deltas, _F64(c)) for e in ordered if (c := coefficient(e, name, config)) != 0.0]
    buf, tmp = (None if out is not None else _buffer(size)), _buffer(size)
    for s in spans(size):
        uc = out[s] if out is not None else buf[: s.stop - s.start]
        t = tmp[: s.stop - s.start]
        if not terms:
            uc[...] = 0.0
        for i, (deltas, c) in enumerate(terms):
            x = span_of(deltas, name, s)  # float32; each product below is float64(x)·c, one rounding
            if i == 0:
                np.multiply(x, c, out=uc, dtype=_F64)
            else:
                np.multiply(x, c, out=t, dtype=_F64)
                uc += t
        yield s, uc, float(np.sum(np.square(uc, out=t)))


def accumulate_sorted(
    entries: Sequence[SlotEntry], config: LedgerConfig, out: Mapping[str, np.ndarray]
) -> dict[str, float]:
    """Canonical ``U`` of ``entries`` written into the float64 arrays ``out``; returns each ``‖U‖``."""

    def one(name: str) -> float:
        uf = flat(out[name])
        return math.sqrt(math.fsum(part for _, _, part in canonical_spans(entries, name, config, uf.size, uf)))

    names = list(out)
    return dict(zip(names, parallel_map(one, names), strict=True))


def aggregate(
    entries: Sequence[SlotEntry], shapes: Mapping[str, tuple[int, ...]], config: LedgerConfig
) -> dict[str, np.ndarray]:
    """The canonical aggregate ``g = s·U`` (new float64 arrays, one per tensor in ``shapes``)."""
    out = {name: np.empty(shape, dtype=_F64) for name, shape in shapes.items()}
    for name, norm in accumulate_sorted(entries, config, out).items():
        out[name] *= _F64(slot_scale(entries, name, config, norm))
    return out
