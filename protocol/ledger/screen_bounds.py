"""The direction screen's verdict on a late update of a new origin, certified without a pass over the slot.

When a late update ``n`` of an origin that has nothing in the newest closed slot joins it, the screen
(:func:`protocol.ledger.aggregate._screened`) must judge the new set ``R' = R ∪ {n}``, and its sums
(``‖U_{R'}‖²``, each ``⟨Δ_i, U_{R'}⟩``) need every payload of the slot decoded: nearly a close's work, for a
verdict that on honest slots is nearly always "everyone stays". This module proves that verdict instead,
when it holds by far more than any rounding, from what the ledger already has:

* the screen's sums of ``R`` (exact: the close took them), or intervals holding them (an earlier
  certificate: :class:`ScreenBounds`);
* ``y = ⟨Δ_n, U_R⟩``, within the rounding of the slot's kept float32 sum (one pass over the new update and
  that sum: :func:`along_kept`);
* for the unknown ``⟨Δ_i, Δ_n⟩``, the angles to ``U_R``: if ``Δ_i`` is at angle ``a`` from ``U_R`` and ``Δ_n``
  at angle ``b``, they are at most ``a + b`` apart (the triangle inequality on the sphere), so
  ``⟨Δ_i, Δ_n⟩ ≥ ‖Δ_i‖‖Δ_n‖ cos(min(π, a + b))``; and at most ``‖Δ_i‖‖Δ_n‖``.

From these, :func:`extend` bounds the sums of ``R'`` and :func:`keeps_everyone` checks that every cosine the
screen would take of ``R'`` (PROTOCOL.md, "Direction screen") is above ``κ`` by more than
``MARGIN``: then the canonical screen, evaluated in floating point on any replica, keeps every update of
``R'`` (its rounding moves each compared quantity by ~1e-13 of the scale ``‖Δ_i‖·Σ_j c_j‖Δ_j‖``, where
the margin is 1e-6 of it), and the ledger skips the pass. When the bounds do not clear ``κ`` by the margin,
nothing is decided here: the screen takes the exact sums as before. The verdict, and so every replica's
bits, is the same either way; only the work differs. Certificates chain (a second new origin extends the
first one's intervals), widening each time until a pass is needed again.

Pure: numbers and arrays in, numbers out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from protocol.ledger.chunks import CHUNK, flat, spans
from protocol.ledger.payload import span_of

__all__ = ["MARGIN", "ScreenBounds", "along_kept", "extend", "keeps_everyone", "kept_interval"]

#: Slack for the rounding of a canonically computed sum, relative to its scale (``Σ_j c_j‖Δ_j‖`` times
#: ``‖Δ_i‖``, or squared for ``‖U‖²``): ~1e-13 covers slots of thousands of updates; this is 1,000× that.
ROUNDING = 1e-10
#: How far above ``κ`` (relative to ``‖Δ_i‖·Σ_j c_j‖Δ_j‖``) a bound must be to certify the verdict.
MARGIN = 1e-6
#: Radians added to the angle bound ``a + b``: ``acos`` near ±1 turns a rounding of ~1e-15 in its argument
#: into up to ~5e-8 of angle.
ANGLE_SLACK = 1e-7

#: (id, c_i, ‖Δ_i‖) of each live term of a set, in ascending id order.
Terms = Sequence[tuple[bytes, float, float]]


@dataclass(frozen=True)
class ScreenBounds:
    """Closed intervals ``(lo, hi)`` holding the exact ``‖U_R‖²`` and each ``⟨Δ_i, U_R⟩`` (by id) of a set
    ``R`` of a tensor's live terms."""

    u_squared: tuple[float, float]
    along: Mapping[bytes, tuple[float, float]]

    @classmethod
    def exact(cls, u_squared: float, along: Mapping[bytes, float], terms: Terms) -> ScreenBounds:
        """Intervals around canonically computed sums, wide enough for their rounding."""
        return cls.around(u_squared, along, terms, ROUNDING)

    @classmethod
    def around(cls, u_squared: float, along: Mapping[bytes, float], terms: Terms, rel: float) -> ScreenBounds:
        """Intervals around sums known within ``rel`` of their scale: ``‖U‖²`` within ``rel·S²``, each
        ``⟨Δ_i, U⟩`` within ``rel·‖Δ_i‖·S`` (``S = Σ_j |c_j|‖Δ_j‖``)."""
        scale = _scale(terms)
        norms = {i: n for i, _, n in terms}
        return cls(u_squared=(u_squared - rel * scale * scale, u_squared + rel * scale * scale),
                   along={i: (d - rel * norms[i] * scale, d + rel * norms[i] * scale) for i, d in along.items()})

    def u_squared_within(self, rel: float) -> float | None:
        """The middle of the ``‖U‖²`` interval when the interval is within ``rel`` of it, else None."""
        lo, hi = self.u_squared
        mid = 0.5 * (lo + hi)
        return mid if mid > 0.0 and hi - lo <= 2.0 * rel * mid else None


def _scale(terms: Terms) -> float:
    """``Σ_j |c_j|‖Δ_j‖``: at least ``‖U‖``, the scale every rounding slack and margin is relative to."""
    return math.fsum(abs(c) * n for _, c, n in terms)


def along_kept(kept: np.ndarray, deltas: Mapping[str, np.ndarray], name: str) -> float:
    """``⟨Δ[name], kept⟩`` in float64 (each product exact, numpy's pairwise sum per chunk, ``math.fsum``
    across chunks), ``kept`` a slot's float32 kept sum and ``deltas`` an entry's (arrays or a payload)."""
    kf = flat(kept)
    tmp = np.empty(min(kf.size, CHUNK), dtype=np.float64)
    parts = []
    for s in spans(kf.size):
        t = tmp[: s.stop - s.start]
        np.multiply(span_of(deltas, name, s), kf[s], out=t, dtype=np.float64)
        parts.append(float(np.sum(t)))
    return math.fsum(parts)


def kept_interval(y: float, norm: float, terms: Terms, folds: int) -> tuple[float, float]:
    """An interval holding ``⟨Δ_n, U_R⟩`` given ``y``, the same taken against the slot's float32 kept sum
    (:func:`along_kept`) of ``R``'s terms (``terms``), ``norm = ‖Δ_n‖`` and ``folds``, an upper bound on the
    float32 roundings the kept sum went through (one when the slot closed, one per late fold since). Each
    rounding moves an element by at most ``2⁻²⁴`` of ``Σ_j |c_j Δ_j|`` there, so the sum is within
    ``folds·2⁻²⁴·Σ_j |c_j|‖Δ_j‖`` of ``U_R`` (2⁻²³ is used: room for the float64 parts)."""
    slack = (folds * 2.0**-23 + ROUNDING) * norm * _scale(terms)
    return y - slack, y + slack


def _cos_lower(dot_lo: float, a: float, u_squared: tuple[float, float]) -> float:
    """A lower bound on the cosine between a vector of norm ``a`` whose inner product with ``U`` is at least
    ``dot_lo`` and ``U``, for ``‖U‖²`` in ``u_squared``; in [-1, 1]."""
    lo, hi = max(u_squared[0], 0.0), max(u_squared[1], 0.0)
    if a <= 0.0 or hi <= 0.0:
        return -1.0
    if dot_lo >= 0.0:
        q = dot_lo / (a * math.sqrt(hi))
    elif lo <= 0.0:
        return -1.0
    else:
        q = dot_lo / (a * math.sqrt(lo))
    return min(1.0, max(-1.0, q))


def _times(k: float, interval: tuple[float, float]) -> tuple[float, float]:
    """``k`` times an interval."""
    a, b = k * interval[0], k * interval[1]
    return (a, b) if a <= b else (b, a)


def extend(bounds: ScreenBounds, terms: Terms, new: tuple[bytes, float, float], y: tuple[float, float],
           changes: Mapping[bytes, float] | None = None) -> ScreenBounds:
    """Intervals for the set ``R ∪ {n}`` from ``bounds`` of ``R`` (whose live terms are ``terms``), the new
    term ``new = (id, c_n, ‖Δ_n‖)``, ``y``, an interval holding ``⟨Δ_n, U_R⟩``, and ``changes``: ``δ_k`` for
    each ``k`` of ``R`` whose coefficient the new update changes to ``c_k + δ_k`` (it moved the norm bound).
    Needs ``c_n > 0``.

    ``U_{R'} = U_R + Σ_k δ_k Δ_k + c_n Δ_n``, so ``⟨Δ_i, U_{R'}⟩ = ⟨Δ_i, U_R⟩ + Σ_k δ_k⟨Δ_i, Δ_k⟩ + c_n⟨Δ_i, Δ_n⟩``,
    ``⟨Δ_n, U_{R'}⟩ = ⟨Δ_n, U_R⟩ + Σ_k δ_k⟨Δ_k, Δ_n⟩ + c_n‖Δ_n‖²`` and ``‖U_{R'}‖² = ‖U_R‖² + 2Σ_k δ_k⟨Δ_k, U_R⟩
    + 2c_n⟨Δ_n, U_R⟩ + Σ_{k,l} δ_k δ_l⟨Δ_k, Δ_l⟩ + 2c_n Σ_k δ_k⟨Δ_k, Δ_n⟩ + c_n²‖Δ_n‖²``; each unknown inner
    product ``⟨Δ_i, Δ_j⟩`` (``i ≠ j``) lies between ``‖Δ_i‖‖Δ_j‖ cos(min(π, a_i + a_j))`` and ``‖Δ_i‖‖Δ_j‖``,
    ``a`` the angles to ``U_R`` (the module docstring). Every interval is widened by the rounding of its own
    evaluation."""
    new_id, c, nn = new
    if not c > 0.0:
        raise ValueError("a certified term has a positive coefficient")
    changes = changes or {}
    norms = {i: n for i, _, n in terms}
    scale = math.fsum([*(max(abs(ci), abs(ci + changes.get(i, 0.0))) * n for i, ci, n in terms), c * nn])
    slack = ROUNDING * scale
    angle = {i: math.acos(_cos_lower(bounds.along[i][0], n, bounds.u_squared)) for i, _, n in terms}
    angle[new_id], norms[new_id] = math.acos(_cos_lower(y[0], nn, bounds.u_squared)), nn

    def gram(i: bytes, j: bytes) -> tuple[float, float]:
        """An interval holding ``⟨Δ_i, Δ_j⟩``."""
        if i == j:
            return norms[i] * norms[i], norms[i] * norms[i]
        top = norms[i] * norms[j]
        return top * math.cos(min(math.pi, angle[i] + angle[j] + ANGLE_SLACK)), top

    def plus(acc: list[float], interval: tuple[float, float]) -> None:
        acc[0] += interval[0]
        acc[1] += interval[1]

    along: dict[bytes, tuple[float, float]] = {}
    for i in [*(t[0] for t in terms), new_id]:
        acc = list(bounds.along[i]) if i != new_id else [y[0], y[1]]
        for k, dk in changes.items():
            plus(acc, _times(dk, gram(i, k)))
        plus(acc, _times(c, gram(i, new_id)))
        along[i] = (acc[0] - slack * norms[i], acc[1] + slack * norms[i])
    acc = list(bounds.u_squared)
    plus(acc, _times(2.0 * c, y))
    plus(acc, (c * c * nn * nn, c * c * nn * nn))
    for k, dk in changes.items():
        plus(acc, _times(2.0 * dk, bounds.along[k]))
        plus(acc, _times(2.0 * c * dk, gram(k, new_id)))
        for j, dj in changes.items():
            plus(acc, _times(dk * dj, gram(k, j)))
    return ScreenBounds(u_squared=(acc[0] - slack * scale, acc[1] + slack * scale), along=along)


def keeps_everyone(bounds: ScreenBounds, terms: Terms, kappa: float) -> bool:
    """Whether the direction screen of a set of three or more live terms (``terms``, every ``c_i > 0`` and
    ``‖Δ_i‖ > 0``) whose sums lie in ``bounds`` provably screens nobody out: for each ``i``, the least
    ``⟨Δ_i, U_{R−i}⟩ = ⟨Δ_i, U_R⟩ − c_i‖Δ_i‖²`` the bounds allow exceeds ``κ‖Δ_i‖‖U_{R−i}‖`` at the largest
    ``‖U_{R−i}‖² = ‖U_R‖² − 2c_i⟨Δ_i, U_R⟩ + c_i²‖Δ_i‖²`` they allow, by ``MARGIN`` of the scale. Only for
    ``κ ≥ 0`` (a negative ``κ`` is never certified)."""
    if kappa < 0.0 or len(terms) < 3 or any(not (c > 0.0 and n > 0.0) for _, c, n in terms):
        return False
    scale = _scale(terms)
    for i, c, n in terms:
        d_lo = bounds.along[i][0]
        own = c * n
        along = d_lo - own * n
        rest_hi = bounds.u_squared[1] - 2.0 * c * d_lo + own * own
        need = MARGIN * n * scale
        if not (along > need and along - kappa * n * math.sqrt(max(rest_hi, 0.0)) > need):
            return False
    return True
