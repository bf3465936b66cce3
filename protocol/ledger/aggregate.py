"""A slot's aggregate: a function of the *set* of updates applied at the slot.

Per tensor, with weights ``w_i`` and pseudo-gradients ``Δ_i``, the aggregate is ``g = s · U`` where
``U = Σ c_i Δ_i`` is a float64 accumulator with per-update coefficients ``c_i`` and ``s`` a per-slot scale,
both from :func:`tensor_terms`.

Bounded influence (:mod:`protocol.ledger.bound`: which entries count, and the norm bound ``τ``): per origin,
only the update with the smallest ``update_id`` counts (the others get ``c_i = 0`` and no weight), and each
counted update's norm enters as ``ñ_i = min(‖Δ_i‖, τ)``, ``τ`` = ``norm_clip`` × the lower median
of the counted norms. With three or more counted updates, those whose direction disagrees with the sum of
the others (cosine at most ``direction_screen``) are screened out of the tensor (``c_i = 0``, no weight) one
at a time, the most disagreeing first, the cosines taken again among the rest each time, while three are
left to judge by and more than half of them stay; two that disagree are both screened out. Then:

* mean: ``c_i = w_i · ñ_i / ‖Δ_i‖`` (``w_i`` unclipped), ``s = 1 / Σ w_i`` — the weighted average of the
  clipped updates;
* radial-directional (every tensor except the configured embeddings): ``c_i = w_i / ‖Δ_i‖`` (0 for a zero
  update), ``s = (Σ w_i ñ_i / Σ w_i) / max(‖U‖, sqrt(Σ w_i²))`` — the weighted mean clipped norm times the
  normalized weighted mean direction. The floor ``sqrt(Σ w_i²)`` (counted nonzero updates) is the norm of
  ``U`` for unit vectors that neither agree nor oppose: directions that cancel (a negated update against
  honest ones) give a short step, not a noise direction blown up to the full mean norm. Honest
  pseudo-gradients agree more than they oppose, so it rarely binds for them (``norm_clip = 0`` turns it off
  with the clip). ``U = 0`` gives ``g = 0``; an empty slot aggregates to zeros.

A late update changes ``c_i`` of the slot's other entries only when it moves ``τ`` across one of their
norms or displaces an entry of its origin; the fold then takes every changed term in the same pass
(``protocol.ledger.outer.fold_change``; :func:`norm_with_terms` gives the new norm first). The
*canonical* value (:func:`canonical_spans`, :func:`accumulate_sorted`) visits entries in ascending
``update_id`` order and is bit-identical on every replica holding the same set (scalar sums use
``math.fsum``; norms use numpy's pairwise summation over fixed chunks, never BLAS; terms with
``c_i = 0`` are skipped).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protocol.ledger.bound import counted, norm_bound
from protocol.ledger.chunks import CHUNK, flat, spans
from protocol.parallel import parallel_map
from protocol.ledger.config import Aggregation, LedgerConfig, UpdateMeta
from protocol.ledger.payload import Payload, PayloadDeltas, span_of

__all__ = ["GramCache", "SlotEntry", "TensorTerms", "accumulate_sorted", "aggregate", "canonical_spans", "norm_with_terms",
           "slot_scale", "tensor_terms", "uses_radial"]

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


@dataclass(frozen=True)
class TensorTerms:
    """One tensor's terms over a slot's set: ``c_i`` by update id (0 for an entry that does not count or
    has norm 0) and what the scale needs (``Σ w_i`` and, radial, ``Σ w_i ñ_i``, over counted entries)."""

    radial: bool
    coefficients: Mapping[bytes, float]
    total_weight: float
    weighted_norms: float
    floor: float = 0.0  # radial: sqrt(Σ w_i²) over counted nonzero updates, the least ‖U‖ divided by

    def scale(self, u_norm: float) -> float:
        """``s`` given the accumulator's norm (unused for a mean tensor)."""
        if self.total_weight <= 0.0:
            return 0.0
        if not self.radial:
            return 1.0 / self.total_weight
        if u_norm <= 0.0:
            return 0.0
        return (self.weighted_norms / self.total_weight) / max(u_norm, self.floor)


class GramCache:
    """Inner products ``⟨Δ_i, Δ_j⟩`` of a slot's entries, per tensor, computed canonically (fixed chunks,
    numpy's pairwise sum of the binary64 products within a chunk, ``math.fsum`` across chunks) and kept:
    an entry's values never change (its id covers its payload), so a late update adds only its own row.
    Owned by one :class:`~protocol.ledger.slot.LiveSlot` (a bare aggregate makes a throwaway one)."""

    def __init__(self) -> None:
        self._dots: dict[tuple[str, bytes, bytes], float] = {}

    def dots(self, entries: Sequence[SlotEntry], name: str) -> Mapping[tuple[bytes, bytes], float]:
        """``⟨Δ_i, Δ_j⟩`` for every pair (ids ascending within a pair) of ``entries``."""
        ordered = sorted(entries, key=lambda e: e.meta.update_id)
        pairs = [(a, b) for i, a in enumerate(ordered) for b in ordered[i:]
                 if (name, a.meta.update_id, b.meta.update_id) not in self._dots]
        if pairs:
            self._compute(pairs, name)
        return {(a.meta.update_id, b.meta.update_id): self._dots[(name, a.meta.update_id, b.meta.update_id)]
                for i, a in enumerate(ordered) for b in ordered[i:]}

    def has(self, entries: Sequence[SlotEntry], name: str) -> bool:
        """Whether every inner product of ``entries``' tensor ``name`` is known."""
        ids = sorted(e.meta.update_id for e in entries)
        return all((name, a, b) in self._dots for i, a in enumerate(ids) for b in ids[i:])

    def put(self, name: str, dots: Mapping[tuple[bytes, bytes], float]) -> None:
        """Record inner products ``(id_a, id_b) → ⟨Δ_a, Δ_b⟩`` (ids ascending) taken canonically elsewhere
        (``_accumulate_with_dots``: the same chunks and sums as :meth:`dots`)."""
        for (a, b), value in dots.items():
            self._dots[(name, a, b)] = value

    def _compute(self, pairs: list[tuple[SlotEntry, SlotEntry]], name: str) -> None:
        involved = {e.meta.update_id: e for pair in pairs for e in pair}
        size = _numel(next(iter(involved.values())), name)
        parts: dict[tuple[bytes, bytes], list[float]] = {(a.meta.update_id, b.meta.update_id): [] for a, b in pairs}
        for s in spans(size):
            xs = {i: span_of(e.deltas, name, s).astype(_F64) for i, e in involved.items()}
            for (i, j), out in parts.items():
                out.append(float(np.sum(xs[i] * xs[j])))
        for (i, j), out in parts.items():
            self._dots[(name, i, j)] = math.fsum(out)


def _numel(entry: SlotEntry, name: str) -> int:
    """Elements of tensor ``name`` of ``entry`` (a payload's from its shapes, without decoding it)."""
    if isinstance(entry.deltas, PayloadDeltas):
        return math.prod(entry.deltas.shapes[name])
    return int(entry.deltas[name].size)


def step_bound(entry: SlotEntry, name: str, config: LedgerConfig) -> float:
    """The most a tensor's norm can be for an update of ``entry``'s claimed inner steps:
    ``(max_step_rms · inner_steps) · sqrt(size)`` (``inf`` when the run sets no ``max_step_rms``). A function
    of the update alone: it bounds a slot that holds one update, where no median can."""
    if config.max_step_rms is None or config.norm_clip == 0.0:
        return math.inf
    return (config.max_step_rms * entry.meta.inner_steps) * math.sqrt(_numel(entry, name))


def _screened(kept: list[SlotEntry], coefficients: dict[bytes, float], name: str, config: LedgerConfig,
              gram: GramCache | None) -> set[bytes]:
    """Ids of counted entries whose direction disagrees with the rest of the slot (see the module docstring):
    among the ``m ≥ 3`` counted nonzero entries still in, entry ``i`` disagrees when the cosine ``q_i`` between
    ``Δ_i`` and ``U_{-i} = Σ_{j≠i} c_j Δ_j`` is at most ``direction_screen``; the one with the smallest
    ``q_i`` (ties: the smaller id) is screened out and the cosines are taken again, while at least three are
    in and more than half of the ``m`` would stay. (All at once, a negated update's pull on the others' sums
    could make every update of a three-update slot "disagree", and then nobody was screened.) With exactly two,
    both are screened out when their cosine is at most ``direction_screen``: a step along their difference
    would be noise (one honest update and one negated one)."""
    live = sorted((e for e in kept if coefficients[e.meta.update_id] != 0.0), key=lambda e: e.meta.update_id)
    if config.direction_screen is None or config.norm_clip == 0.0 or len(live) < 2:
        return set()
    dots = (gram or GramCache()).dots(live, name)

    def g(a: bytes, b: bytes) -> float:
        return dots[(a, b) if a <= b else (b, a)]

    if len(live) == 2:  # two that pull apart give no direction to step in: neither counts
        (a, na), (b, nb) = ((e.meta.update_id, e.norms[name]) for e in live)
        disagree = na <= 0.0 or nb <= 0.0 or g(a, b) <= config.direction_screen * na * nb
        return {a, b} if disagree else set()

    c = {e.meta.update_id: coefficients[e.meta.update_id] for e in live}
    norms = {e.meta.update_id: e.norms[name] for e in live}
    remaining = [e.meta.update_id for e in live]
    out: set[bytes] = set()
    while len(remaining) >= 3 and 2 * (len(remaining) - 1) > len(live):
        worst: tuple[float, bytes] | None = None
        for i in remaining:  # in id order: a tie keeps the smaller id
            others = [j for j in remaining if j != i]
            along = math.fsum(c[j] * g(i, j) for j in others)  # ⟨Δ_i, U_{-i}⟩
            rest_sq = math.fsum(c[j] * c[k] * g(j, k) for j in others for k in others)  # ‖U_{-i}‖²
            if rest_sq <= 0.0 or norms[i] <= 0.0:  # nothing to agree with, or no direction of its own
                q = -math.inf
            elif along <= config.direction_screen * norms[i] * math.sqrt(rest_sq):
                q = along / (norms[i] * math.sqrt(rest_sq))
            else:
                continue
            if worst is None or q < worst[0]:
                worst = (q, i)
        if worst is None:
            break
        out.add(worst[1])
        remaining.remove(worst[1])
    return out


def tensor_terms(entries: Sequence[SlotEntry], name: str, config: LedgerConfig,
                 gram: GramCache | None = None, *, screen: bool = True) -> TensorTerms:
    """The terms of tensor ``name`` for a slot holding ``entries`` (see the module docstring); ``gram`` keeps
    the inner products the direction screen needs (computed here when not given). ``screen=False``: the
    terms before the direction screen (no inner products needed)."""
    radial = uses_radial(name, config)
    kept = counted(entries)
    tau = norm_bound(kept, name, config)
    coefficients = dict.fromkeys((e.meta.update_id for e in entries), 0.0)
    limit = {e.meta.update_id: min(tau, step_bound(e, name, config)) for e in kept}
    for e in kept:
        norm, bound = e.norms[name], limit[e.meta.update_id]
        if norm <= 0.0:
            coefficients[e.meta.update_id] = 0.0 if radial else e.weight
        elif radial:
            coefficients[e.meta.update_id] = e.weight / norm
        else:
            coefficients[e.meta.update_id] = e.weight if norm <= bound else e.weight * (bound / norm)
    screened = _screened(kept, coefficients, name, config, gram) if screen else set()
    if screened:
        for i in screened:
            coefficients[i] = 0.0
        kept = [e for e in kept if e.meta.update_id not in screened]
    return TensorTerms(
        radial=radial,
        coefficients=coefficients,
        total_weight=math.fsum(e.weight for e in kept),
        weighted_norms=math.fsum(e.weight * min(e.norms[name], limit[e.meta.update_id]) for e in kept),
        floor=math.sqrt(math.fsum(e.weight * e.weight for e in kept if e.norms[name] > 0.0))
        if radial and config.norm_clip > 0.0 else 0.0,
    )


def slot_scale(entries: Sequence[SlotEntry], name: str, config: LedgerConfig, u_norm: float,
               gram: GramCache | None = None) -> float:
    """``s`` for tensor ``name`` of a slot holding ``entries`` whose accumulator has norm ``u_norm``."""
    return tensor_terms(entries, name, config, gram).scale(u_norm)


def _buffer(size: int) -> np.ndarray:
    return np.empty(min(CHUNK, size), dtype=_F64)


def norm_with_terms(u: np.ndarray, name: str, terms: Sequence[tuple[Mapping[str, np.ndarray], float]]) -> float:
    """``‖u + Σ c_j·Δ_j[name]‖`` in float64 (canonical chunking), ``u`` float64 or a float32 kept sum,
    each ``Δ_j`` an entry's deltas (float32 arrays or a payload, read span by span); nothing is written."""
    uf, buf, tmp = flat(u), _buffer(u.size), _buffer(u.size)
    parts = []
    for s in spans(uf.size):
        t, x = buf[: s.stop - s.start], tmp[: s.stop - s.start]
        t[...] = uf[s]
        for deltas, c in terms:
            np.multiply(span_of(deltas, name, s), _F64(c), out=x, dtype=_F64)
            t += x
        parts.append(float(np.sum(np.square(t, out=t))))
    return math.sqrt(math.fsum(parts))


def canonical_spans(
    entries: Sequence[SlotEntry], name: str, config: LedgerConfig, size: int, out: np.ndarray | None = None,
    gram: GramCache | None = None,
) -> Iterator[tuple[slice, np.ndarray, float]]:
    """Tensor ``name``'s canonical ``U`` over ``entries``, span by span (the fixed chunking): yields
    ``(span, U over it, its sum of squares)``. ``U`` is written into ``out`` (a flat float64 array of
    ``size``) if given, else into one chunk-sized buffer reused for the next span."""
    ordered = sorted(entries, key=lambda e: e.meta.update_id)
    coefficients = tensor_terms(entries, name, config, gram).coefficients
    terms = [(e.deltas, _F64(c)) for e in ordered if (c := coefficients[e.meta.update_id]) != 0.0]
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


def _screen_needs_dots(terms: TensorTerms, config: LedgerConfig) -> bool:
    """Whether the direction screen will read inner products for these terms (as ``_screened`` decides)."""
    live = sum(c != 0.0 for c in terms.coefficients.values())
    return config.direction_screen is not None and config.norm_clip != 0.0 and live >= 2


def _accumulate_with_dots(
    entries: Sequence[SlotEntry], name: str, config: LedgerConfig, uf: np.ndarray, gram: GramCache
) -> float | None:
    """One pass over tensor ``name``'s payloads that writes ``U`` with the coefficients *before* the direction
    screen into the flat float64 ``uf`` and takes the inner products the screen reads (each span of each entry
    decoded once for both, where :func:`canonical_spans` after :meth:`GramCache.dots` decodes it twice).
    Returns ``‖U‖`` when the screen then leaves every coefficient as it was (honest slots: ``U`` is then the
    canonical one, bit for bit: the same terms in the same order, the same operations), else None (the
    caller sums again with the screened coefficients), and None at once when the screen needs no inner
    products or ``gram`` has them all (a slot leaving the window: its close took them)."""
    before = tensor_terms(entries, name, config, screen=False)
    ordered = sorted(entries, key=lambda e: e.meta.update_id)
    live = [(e, _F64(c)) for e in ordered if (c := before.coefficients[e.meta.update_id]) != 0.0]
    if not _screen_needs_dots(before, config) or gram.has([e for e, _ in live], name):
        return None
    pairs = [(i, j) for i in range(len(live)) for j in range(i, len(live))]
    parts: list[list[float]] = [[] for _ in pairs]
    squares, tmp = [], _buffer(uf.size)
    for s in spans(uf.size):
        uc, t = uf[s], tmp[: s.stop - s.start]
        xs = [span_of(e.deltas, name, s).astype(_F64) for e, _ in live]
        for k, (x, (_, c)) in enumerate(zip(xs, live, strict=True)):
            if k == 0:
                np.multiply(x, c, out=uc)
            else:
                np.multiply(x, c, out=t)
                uc += t
        for part, (i, j) in zip(parts, pairs, strict=True):
            part.append(float(np.sum(np.multiply(xs[i], xs[j], out=t))))
        squares.append(float(np.sum(np.square(uc, out=t))))
    gram.put(name, {(live[i][0].meta.update_id, live[j][0].meta.update_id): math.fsum(part)
                    for part, (i, j) in zip(parts, pairs, strict=True)})
    after = tensor_terms(entries, name, config, gram)
    return math.sqrt(math.fsum(squares)) if after.coefficients == before.coefficients else None


def accumulate_sorted(
    entries: Sequence[SlotEntry], config: LedgerConfig, out: Mapping[str, np.ndarray], gram: GramCache | None = None
) -> dict[str, float]:
    """Canonical ``U`` of ``entries`` written into the float64 arrays ``out``; returns each ``‖U‖``. A tensor
    whose inner products ``gram`` lacks takes them in the same pass (:func:`_accumulate_with_dots`)."""
    gram = gram if gram is not None else GramCache()

    def one(name: str) -> float:
        uf = flat(out[name])
        norm = _accumulate_with_dots(entries, name, config, uf, gram)
        if norm is not None:
            return norm
        return math.sqrt(math.fsum(part for _, _, part in canonical_spans(entries, name, config, uf.size, uf, gram)))

    names = list(out)
    return dict(zip(names, parallel_map(one, names), strict=True))


def aggregate(
    entries: Sequence[SlotEntry], shapes: Mapping[str, tuple[int, ...]], config: LedgerConfig
) -> dict[str, np.ndarray]:
    """The canonical aggregate ``g = s·U`` (new float64 arrays, one per tensor in ``shapes``)."""
    out = {name: np.empty(shape, dtype=_F64) for name, shape in shapes.items()}
    gram = GramCache()
    for name, norm in accumulate_sorted(entries, config, out, gram).items():
        out[name] *= _F64(slot_scale(entries, name, config, norm, gram))
    return out
