"""A slot's aggregate: a function of the *set* of updates applied at the slot.

Per tensor, with weights ``w_i`` and pseudo-gradients ``Δ_i``, the aggregate is ``g = s · U`` where
``U = Σ c_i Δ_i`` is a float64 accumulator with per-update coefficients ``c_i`` and ``s`` a per-slot scale,
both from :func:`tensor_terms`.

Bounded influence (:mod:`protocol.ledger.bound`: which entries count, and the norm bound ``τ``): per origin,
only the update with the smallest ``update_id`` counts (the others get ``c_i = 0`` and no weight; none of an
origin with more than ``max_updates_per_origin`` updates in the slot), and each
counted update's norm enters as ``ñ_i = min(‖Δ_i‖, τ)``, ``τ`` = ``norm_clip`` × the lower median
of the counted norms. With three or more counted updates, those whose direction disagrees with the sum of
the others (cosine at most ``direction_screen``) are screened out of the tensor (``c_i = 0``, no weight) one
at a time, first the one whose leaving makes the rest agree most, the cosines taken again among the rest
each time, while three are left to judge by and more than half of them stay; two that disagree are both
screened out. Of counted updates whose deltas are bit-identical (one payload from colluding origins),
only the smallest id counts (:func:`protocol.ledger.bound.distinct`). The cosines
come from ``‖U_R‖²`` and ``⟨Δ_i, U_R⟩`` of the sum ``U_R`` over the updates still in (:class:`ScreenSums`:
N + 1 inner products per element, in the same pass as ``U``), not from every pair's inner product; a set
the slot proved to keep everyone from bounds (a late update of a new origin:
:mod:`protocol.ledger.screen_bounds`, :meth:`ScreenCache.certify`) takes no pass at all, and one proved so
from a fast estimate of its sums (:func:`screen_estimate`: a late update that takes a term away) takes that
cheaper pass instead. Then:

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
(``protocol.ledger.outer.fold_change``; :func:`norm_with_terms` gives the new norm first, or, for the
late update's term alone in a kept sum, ``protocol.ledger.slot.LiveSlot`` from one inner product). The
*canonical* value (:func:`canonical_spans`, :func:`accumulate_sorted`) visits entries in ascending
``update_id`` order and is bit-identical on every replica holding the same set (scalar sums use
``math.fsum``; norms use numpy's pairwise summation over fixed chunks, never BLAS; terms with
``c_i = 0`` are skipped).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from protocol import kernels
from protocol.kernels import accumulate_term
from protocol.ledger.bound import counted, norm_bound
from protocol.ledger.chunks import CHUNK, flat, spans
from protocol.parallel import parallel_map
from protocol.ledger.config import Aggregation, LedgerConfig, UpdateMeta
from protocol.ledger.payload import Payload, PayloadDeltas, span_of
from protocol.ledger.screen_bounds import ROUNDING, ScreenBounds, keeps_everyone

__all__ = ["ScreenCache", "ScreenSums", "SlotEntry", "TensorTerms", "accumulate_sorted", "aggregate", "bound_terms",
           "canonical_spans", "norm_with_terms", "screen_estimate", "screen_pass", "slot_scale", "span_screen_sums",
           "tensor_terms", "uses_radial"]

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
    commitment: bytes | None = None  # a reduced run's header entry: the hash its origin signed for the values

    @cached_property
    def norms_key(self) -> tuple[float, ...]:
        """Every tensor's norm, in name order: equal for bit-identical deltas (``protocol.ledger.bound.distinct``)."""
        return tuple(self.norms[name] for name in sorted(self.norms))


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


#: The live terms of a tensor the screen judges: (entry, c_i) in ascending id order, every c_i ≠ 0.
LiveTerms = Sequence[tuple[SlotEntry, float]]


@dataclass(frozen=True)
class ScreenSums:
    """What the direction screen reads of a set ``R`` of a tensor's live terms, each computed canonically
    (fixed chunks, numpy's pairwise sum within a chunk, ``math.fsum`` across chunks): ``‖U_R‖²`` of the
    accumulator ``U_R = Σ_{j∈R} c_j Δ_j`` (summed as the aggregate's ``U`` is), ``⟨Δ_i, U_R⟩`` for each ``i``
    in ``R`` (by id), and for a set of two, ``⟨Δ_a, Δ_b⟩``. From these, ``⟨Δ_i, U_{R−i}⟩`` and ``‖U_{R−i}‖²``
    follow without the inner products of every pair (:func:`_screened`)."""

    u_squared: float
    along: Mapping[bytes, float]
    pair: float | None = None


class ScreenCache:
    """:class:`ScreenSums` of the sets a slot's screen has judged, per tensor, keyed by the set's ids and
    coefficients: a late update that changes the set costs one pass over the slot's payloads, a set seen
    before nothing. Owned by one :class:`~protocol.ledger.slot.LiveSlot` (a bare aggregate makes a throwaway
    one); tensors are summed in parallel threads, each writing its own keys."""

    def __init__(self) -> None:
        self._sums: dict[tuple[str, tuple[tuple[bytes, float], ...]], ScreenSums] = {}
        self._certified: dict[tuple[str, tuple[tuple[bytes, float], ...]], ScreenBounds] = {}

    @staticmethod
    def _key(name: str, live: LiveTerms) -> tuple[str, tuple[tuple[bytes, float], ...]]:
        return name, tuple((e.meta.update_id, float(c)) for e, c in live)

    def get(self, name: str, live: LiveTerms) -> ScreenSums | None:
        return self._sums.get(self._key(name, live))

    def put(self, name: str, live: LiveTerms, sums: ScreenSums) -> None:
        self._sums[self._key(name, live)] = sums

    def bounds(self, name: str, live: LiveTerms) -> ScreenBounds | None:
        """Intervals holding the sums of ``live``: around its exact sums, or a certificate's; None when
        neither is known."""
        known = self.get(name, live)
        if known is not None:
            return ScreenBounds.exact(known.u_squared, known.along, bound_terms(live, name))
        return self._certified.get(self._key(name, live))

    def certify(self, name: str, live: LiveTerms, bounds: ScreenBounds, kappa: float) -> bool:
        """Given ``bounds`` holding the sums of ``live``: whether they prove that the screen (threshold
        ``kappa``) keeps every update of ``live`` (:func:`~protocol.ledger.screen_bounds.keeps_everyone`);
        if so, recorded: :func:`_screened` then judges ``live`` without its sums."""
        if not keeps_everyone(bounds, bound_terms(live, name), kappa):
            return False
        self._certified[self._key(name, live)] = bounds
        return True

    def certified(self, name: str, live: LiveTerms) -> bool:
        return self._key(name, live) in self._certified

    def sums(self, name: str, live: LiveTerms) -> ScreenSums:
        """The sums of ``live`` (computed in one pass over its payloads when not known)."""
        known = self.get(name, live)
        if known is None:
            known = screen_pass(live, name, _numel(live[0][0], name))
            self.put(name, live, known)
        return known


def bound_terms(live: LiveTerms, name: str) -> list[tuple[bytes, float, float]]:
    """``(id, c_i, ‖Δ_i‖)`` of each of ``live``'s terms, the form :mod:`protocol.ledger.screen_bounds` reads."""
    return [(e.meta.update_id, float(c), e.norms[name]) for e, c in live]


def _sum_span(terms: Sequence[tuple[Mapping[str, np.ndarray], np.float64]], name: str, s: slice, uc: np.ndarray,
              keep: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
    """The accumulator ``U`` over span ``s`` of tensor ``name`` (PROTOCOL.md, Aggregate): ``uc = c·x`` for the
    first term, then ``uc += c·x`` in the given (id) order, each product ``float64(x)·c`` rounded once
    (:func:`protocol.kernels.accumulate_term`; a payload's span is decoded in the same compiled loop when it
    can be, :meth:`PayloadDeltas.add_span`); ``+0`` with no term. With ``keep`` (a buffer per term), returns
    each term's span: decoded into its buffer when it can be, else its float32 values."""
    xs = []
    for k, (deltas, c) in enumerate(terms):
        x = None if keep is None else keep[k][: s.stop - s.start]
        if not (isinstance(deltas, PayloadDeltas) and deltas.add_span(name, s, uc, c, k == 0, x)):
            x = span_of(deltas, name, s)
            accumulate_term(uc, x, c, k == 0)
        xs.append(x)
    if not terms:
        uc[...] = 0.0
    return xs


def span_screen_sums(uc: np.ndarray, xs: Sequence[np.ndarray], tmp: np.ndarray) -> tuple[float, list[float], float | None]:
    """One span's share of :class:`ScreenSums`: ``‖uc‖²``, each ``⟨x_i, uc⟩`` and, for two terms,
    ``⟨x_0, x_1⟩`` (numpy's pairwise sums in float64 over the span; ``tmp`` a float64 buffer of its size).
    Summed over a tensor's spans with ``math.fsum`` they are its canonical sums, whoever computed each span."""
    square = float(np.sum(np.square(uc, out=tmp)))
    products = [float(np.sum(np.multiply(x, uc, out=tmp, dtype=_F64))) for x in xs]
    pair = float(np.sum(np.multiply(xs[0], xs[1], out=tmp, dtype=_F64))) if len(xs) == 2 else None
    return square, products, pair


def screen_pass(live: LiveTerms, name: str, size: int, out: np.ndarray | None = None) -> ScreenSums:
    """One pass over ``live``'s payloads (each span of each decoded once) that sums ``U`` canonically (into
    the flat float64 ``out`` when given, the aggregate's ``U`` for these terms, bit for bit: the same terms in
    the same order, the same operations) and takes the :class:`ScreenSums` of ``live``."""
    buf, tmp = (None if out is not None else _buffer(size)), _buffer(size)
    terms = [(e.deltas, _F64(c)) for e, c in live]
    # float64 spans (the float32 values, exact): a product below then needs no cast, ~2× faster than
    # float32 × float64 in numpy, the same bits
    keep = [np.empty(min(CHUNK, size), dtype=_F64) for _ in live]
    squares: list[float] = []
    along: list[list[float]] = [[] for _ in live]
    pair: list[float] = []
    for s in spans(size):
        uc = out[s] if out is not None else buf[: s.stop - s.start]
        t = tmp[: s.stop - s.start]
        xs = _sum_span(terms, name, s, uc, keep)  # float32 values: each product below is exact or rounded once
        square, products, two = span_screen_sums(uc, xs, t)
        squares.append(square)
        for part, d in zip(along, products, strict=True):
            part.append(d)
        if two is not None:
            pair.append(two)
    return ScreenSums(u_squared=math.fsum(squares),
                      along={e.meta.update_id: math.fsum(part) for (e, _), part in zip(live, along, strict=True)},
                      pair=math.fsum(pair) if len(live) == 2 else None)


#: The double-precision unit roundoff, 2⁻⁵³.
_UNIT = 2.0**-53


def screen_estimate(live: LiveTerms, name: str, size: int) -> ScreenBounds | None:
    """Intervals holding ``live``'s :class:`ScreenSums` (not the pair), from one fast pass over its payloads:
    each span decoded once into a float32 row, then ``U`` and the products summed in any order
    (:func:`protocol.kernels.screen_estimate`). Within a chunk of ``n`` elements and ``m`` terms, any order of
    the sums leaves ``‖U‖²`` within ``(n + 2m)·2⁻⁵³`` of ``S_c²`` and each ``⟨Δ_i, U⟩`` within ``(n + m)·2⁻⁵³``
    of ``‖Δ_i‖_c·S_c`` (``S_c = Σ_j |c_j|‖Δ_j‖_c`` over the chunk, to first order; the chunks' ``S_c²`` and
    ``‖Δ_i‖_c·S_c`` add up to at most ``S²`` and ``‖Δ_i‖·S`` by Cauchy–Schwarz), and ``math.fsum`` adds the
    chunks; the intervals are twice as wide. What the screen then proves from them
    (:meth:`ScreenCache.certify`) the canonical sums would prove too; the pass only saves work: ~5× less
    than :func:`screen_pass` (BENCHMARKS.md, session 32). None when the slack would not be below
    :data:`~protocol.ledger.screen_bounds.ROUNDING`, the slack canonical sums are given."""
    m = len(live)
    rel = 2.0 * (min(CHUNK, size) + 2 * m + 2) * _UNIT
    if not rel < ROUNDING:
        return None
    xs = np.empty((m, min(CHUNK, size)), dtype=np.float32)
    cs = np.array([c for _, c in live], dtype=_F64)
    squares: list[float] = []
    along: list[list[float]] = [[] for _ in live]
    for s in spans(size):
        n = s.stop - s.start
        for k, (e, _) in enumerate(live):
            if not (isinstance(e.deltas, PayloadDeltas) and e.deltas.decode_into(name, s, xs[k])):
                xs[k, :n] = span_of(e.deltas, name, s)
        uu, products = kernels.screen_estimate(xs, n, cs)
        squares.append(uu)
        for part, d in zip(along, products.tolist(), strict=True):
            part.append(d)
    return ScreenBounds.around(math.fsum(squares),
                               {e.meta.update_id: math.fsum(part) for (e, _), part in zip(live, along, strict=True)},
                               bound_terms(live, name), rel)


def _numel(entry: SlotEntry, name: str) -> int:
    """Elements of tensor ``name`` of ``entry`` (a payload's from its shapes, without decoding it)."""
    shapes = getattr(entry.deltas, "shapes", None)  # a payload's, or a header entry's (protocol.reduced)
    if shapes is not None:
        return math.prod(shapes[name])
    return int(entry.deltas[name].size)


def step_bound(entry: SlotEntry, name: str, config: LedgerConfig) -> float:
    """The most a tensor's norm can be for an update of ``entry``'s claimed inner steps:
    ``(max_step_rms · inner_steps) · sqrt(size)`` (``inf`` when the run sets no ``max_step_rms``). A function
    of the update alone: it bounds a slot that holds one update, where no median can."""
    if config.max_step_rms is None or config.norm_clip == 0.0:
        return math.inf
    return (config.max_step_rms * entry.meta.inner_steps) * math.sqrt(_numel(entry, name))


def _screened(kept: list[SlotEntry], coefficients: dict[bytes, float], name: str, config: LedgerConfig,
              cache: ScreenCache | None) -> set[bytes]:
    """Ids of counted entries whose direction disagrees with the rest of the slot (see the module docstring):
    among the ``m ≥ 3`` counted nonzero entries still in (``R``), entry ``i`` disagrees when the cosine ``q_i``
    between ``Δ_i`` and ``U_{R−i} = Σ_{j∈R, j≠i} c_j Δ_j`` is at most ``direction_screen``; of those, the one
    whose leaving makes the rest agree most is screened out (the largest ``‖U_{R−i}‖ / Σ_{j≠i} e_j``, the
    length of the others' mean direction; ties: the smaller id), and the cosines are taken again, while at
    least three are in and more than half of the ``m`` would stay. (All at once, a negated update's pull on
    the others' sums could make every update of a three-update slot "disagree", and then nobody was
    screened. By the smallest cosine, a hostile update that outweighs the weakly agreeing honest ones of a
    small tensor made an honest one's cosine the smallest: the others' sum was then mostly the hostile one.)
    With exactly two, both are screened out when their cosine is at most ``direction_screen``: a step along
    their difference would be noise (one honest update and one negated one).

    The cosines come from the :class:`ScreenSums` of ``R``: with ``d_i = ⟨Δ_i, U_R⟩`` and ``e_i = c_i‖Δ_i‖``,
    ``⟨Δ_i, U_{R−i}⟩ = d_i − e_i‖Δ_i‖`` and ``‖U_{R−i}‖² = ‖U_R‖² − 2c_i d_i + e_i²`` (PROTOCOL.md, the
    screen): one pass per round of the screen, and a second round only when the first screened one out."""
    live = [(e, coefficients[e.meta.update_id])
            for e in sorted(kept, key=lambda e: e.meta.update_id) if coefficients[e.meta.update_id] != 0.0]
    if config.direction_screen is None or config.norm_clip == 0.0 or len(live) < 2:
        return set()
    cache = cache if cache is not None else ScreenCache()
    kappa = config.direction_screen
    if len(live) == 2:  # two that pull apart give no direction to step in: neither counts
        (a, _), (b, _) = live
        na, nb = a.norms[name], b.norms[name]
        disagree = na <= 0.0 or nb <= 0.0 or cache.sums(name, live).pair <= kappa * na * nb
        return {a.meta.update_id, b.meta.update_id} if disagree else set()

    if cache.certified(name, live):  # proven from bounds to keep everyone (a late update of a new origin)
        return set()
    remaining = list(live)
    out: set[bytes] = set()
    while len(remaining) >= 3 and 2 * (len(remaining) - 1) > len(live):
        sums = cache.sums(name, remaining)
        sizes = [c * e.norms[name] for e, c in remaining]  # e_i = c_i‖Δ_i‖
        best: tuple[float, int] | None = None
        for k, (e, c) in enumerate(remaining):  # in id order: a tie takes the smaller id
            norm, d, own = e.norms[name], sums.along[e.meta.update_id], sizes[k]
            along = d - own * norm  # ⟨Δ_i, U_{R−i}⟩
            rest_sq = math.fsum((sums.u_squared, (-2.0 * c) * d, own * own))  # ‖U_{R−i}‖²
            if not (rest_sq <= 0.0 or norm <= 0.0 or along <= kappa * norm * math.sqrt(rest_sq)):
                continue  # it agrees with the others
            rest_size = math.fsum(sizes[:k] + sizes[k + 1:])
            agreement = math.sqrt(rest_sq) / rest_size if rest_sq > 0.0 and rest_size > 0.0 else 0.0
            if best is None or agreement > best[0]:
                best = (agreement, k)
        if best is None:
            break
        out.add(remaining.pop(best[1])[0].meta.update_id)
    return out


def tensor_terms(entries: Sequence[SlotEntry], name: str, config: LedgerConfig,
                 sums: ScreenCache | None = None, *, screen: bool = True) -> TensorTerms:
    """The terms of tensor ``name`` for a slot holding ``entries`` (see the module docstring); ``sums`` keeps
    the sums the direction screen reads (computed here when not given). ``screen=False``: the
    terms before the direction screen (no inner products needed)."""
    radial = uses_radial(name, config)
    kept = counted(entries, config.max_updates_per_origin)
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
    screened = _screened(kept, coefficients, name, config, sums) if screen else set()
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
               sums: ScreenCache | None = None) -> float:
    """``s`` for tensor ``name`` of a slot holding ``entries`` whose accumulator has norm ``u_norm``."""
    return tensor_terms(entries, name, config, sums).scale(u_norm)


def _buffer(size: int) -> np.ndarray:
    return np.empty(min(CHUNK, size), dtype=_F64)


def norm_with_terms(u: np.ndarray, name: str, terms: Sequence[tuple[Mapping[str, np.ndarray], float]]) -> float:
    """``‖u + Σ c_j·Δ_j[name]‖`` in float64 (canonical chunking), ``u`` float64 or a float32 kept sum,
    each ``Δ_j`` an entry's deltas (float32 arrays or a payload, read span by span); nothing is written."""
    uf, buf = flat(u), _buffer(u.size)
    parts = []
    for s in spans(uf.size):
        t = buf[: s.stop - s.start]
        t[...] = uf[s]
        for deltas, c in terms:
            accumulate_term(t, span_of(deltas, name, s), c, first=False)
        parts.append(float(np.sum(np.square(t, out=t))))
    return math.sqrt(math.fsum(parts))


def canonical_spans(
    entries: Sequence[SlotEntry], name: str, config: LedgerConfig, size: int, out: np.ndarray | None = None,
    sums: ScreenCache | None = None,
) -> Iterator[tuple[slice, np.ndarray, float]]:
    """Tensor ``name``'s canonical ``U`` over ``entries``, span by span (the fixed chunking): yields
    ``(span, U over it, its sum of squares)``. ``U`` is written into ``out`` (a flat float64 array of
    ``size``) if given, else into one chunk-sized buffer reused for the next span."""
    ordered = sorted(entries, key=lambda e: e.meta.update_id)
    coefficients = tensor_terms(entries, name, config, sums).coefficients
    terms = [(e.deltas, _F64(c)) for e in ordered if (c := coefficients[e.meta.update_id]) != 0.0]
    buf, tmp = (None if out is not None else _buffer(size)), _buffer(size)
    for s in spans(size):
        uc = out[s] if out is not None else buf[: s.stop - s.start]
        t = tmp[: s.stop - s.start]
        _sum_span(terms, name, s, uc)
        yield s, uc, float(np.sum(np.square(uc, out=t)))


def _accumulate_with_screen(
    entries: Sequence[SlotEntry], name: str, config: LedgerConfig, uf: np.ndarray, sums: ScreenCache
) -> float | None:
    """One pass over tensor ``name``'s payloads that writes ``U`` with the coefficients *before* the direction
    screen into the flat float64 ``uf`` and takes the screen's first :class:`ScreenSums` (:func:`screen_pass`:
    each span of each entry decoded once for both). Returns ``‖U‖`` when the screen then leaves every
    coefficient as it was (honest slots: ``U`` is then the canonical one, bit for bit), else None (the caller
    sums again with the screened coefficients), and None at once when the screen reads nothing (fewer than
    two live terms, or no screen) or ``sums`` has the sums already (a slot leaving the window: its close
    took them)."""
    before = tensor_terms(entries, name, config, screen=False)
    live = [(e, c) for e in sorted(entries, key=lambda e: e.meta.update_id)
            if (c := before.coefficients[e.meta.update_id]) != 0.0]
    if config.direction_screen is None or config.norm_clip == 0.0 or len(live) < 2 or sums.get(name, live) is not None:
        return None
    first = screen_pass(live, name, uf.size, uf)
    sums.put(name, live, first)
    after = tensor_terms(entries, name, config, sums)
    return math.sqrt(first.u_squared) if after.coefficients == before.coefficients else None


def accumulate_sorted(
    entries: Sequence[SlotEntry], config: LedgerConfig, out: Mapping[str, np.ndarray], sums: ScreenCache | None = None
) -> dict[str, float]:
    """Canonical ``U`` of ``entries`` written into the float64 arrays ``out``; returns each ``‖U‖``. A tensor
    whose screen sums ``sums`` lacks takes them in the same pass (:func:`_accumulate_with_screen`)."""
    sums = sums if sums is not None else ScreenCache()

    def one(name: str) -> float:
        uf = flat(out[name])
        norm = _accumulate_with_screen(entries, name, config, uf, sums)
        if norm is not None:
            return norm
        return math.sqrt(math.fsum(part for _, _, part in canonical_spans(entries, name, config, uf.size, uf, sums)))

    names = list(out)
    return dict(zip(names, parallel_map(one, names), strict=True))


def aggregate(
    entries: Sequence[SlotEntry], shapes: Mapping[str, tuple[int, ...]], config: LedgerConfig
) -> dict[str, np.ndarray]:
    """The canonical aggregate ``g = s·U`` (new float64 arrays, one per tensor in ``shapes``)."""
    out = {name: np.empty(shape, dtype=_F64) for name, shape in shapes.items()}
    sums = ScreenCache()
    for name, norm in accumulate_sorted(entries, config, out, sums).items():
        out[name] *= _F64(slot_scale(entries, name, config, norm, sums))
    return out
