"""Stepping the state with a slot's aggregate by the run's outer rule, and the exact fold of a late change.

The rule is :mod:`protocol.ledger.rules`' seam (:func:`outer_step`, :func:`mean_step`); the default, and the
rule the closed form below is derived for, is SGD with Nesterov momentum. Any rule that declares itself
linear gives its own fold coefficients, and :func:`fold_change` applies them.

Recurrence, for slot ``t`` with aggregate ``g_t`` and learning rate ``η_t``::

    v_t = g_t + μ v_{t−1}
    θ_t = θ_{t−1} − η_t (g_t + μ v_t)

Both are linear in the sequence of aggregates. Changing ``g_r`` by ``δ`` (a late update for the closed
slot ``r`` while the state is at slot ``n ≥ r``) changes ``v_t`` by ``μ^{t−r} δ`` for every ``t ≥ r``, hence

    v_n  += μ^{n−r} δ
    θ_n  −= δ · (η_r (1+μ) + Σ_{t=r+1..n} η_t μ^{t−r+1})

since ``θ_n = θ_{r−1} − Σ_{t=r..n} η_t (g_t + μ v_t)`` and the slot-``t`` term changes by
``η_t (δ[t=r] + μ · μ^{t−r} δ)``. Checked against an in-order replay in ``tests/ledger/test_outer.py``.

``θ`` and ``v`` are C-contiguous arrays of the state's dtype (a ledger's are float32, see
:data:`protocol.ledger.storage.STATE_DTYPE`; any float dtype works), updated in place by the elementwise
passes of :mod:`protocol.kernels` (compiled for real model sizes, numpy otherwise, the same bits). Every
intermediate is float64 (``u`` is float64, deltas float32); each new ``v`` and ``θ`` element is the float64
result rounded once to the state's dtype, so the op order below fixes the bits.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from protocol.kernels import fold_finish, fold_start, fold_term
from protocol.ledger.chunks import CHUNK, flat, spans
from protocol.parallel import parallel_map
from protocol.ledger.aggregate import canonical_spans, uses_radial
from protocol.ledger.payload import span_of
from protocol.ledger.rules import Nesterov, OuterRule
from protocol.ledger.slot import LiveSlot, TermChange

if TYPE_CHECKING:
    from protocol.ledger.aggregate import SlotEntry
    from protocol.ledger.config import LedgerConfig

__all__ = ["fold_coefficients", "fold_change", "mean_step", "nesterov_step", "outer_step", "step_slots"]

_F64 = np.float64
Arrays = Mapping[str, np.ndarray]


def outer_step(rule: OuterRule, theta: Arrays, v: Arrays, u: Arrays, scales: Mapping[str, float] | None,
               eta: float) -> None:
    """One outer step of ``rule`` in place with the aggregate ``g = scale·u`` (``scales=None``: ``g = u``),
    span by span (the rule is elementwise), tensors in parallel threads."""

    def one(name: str) -> None:
        thf, vf, uf = np.asarray(flat(theta[name])), np.asarray(flat(v[name])), flat(u[name])
        scale = None if scales is None else scales[name]
        for s in spans(thf.size):  # the numpy path's temporaries stay chunk-sized
            rule.step(thf[s], vf[s], uf[s], scale, eta)

    parallel_map(one, theta)


def nesterov_step(
    theta: Arrays, v: Arrays, u: Arrays, scales: Mapping[str, float] | None, eta: float, mu: float
) -> None:
    """:func:`outer_step` of Nesterov with momentum ``μ``: ``v ← μ v + g``; ``θ ← θ − η (μ v + g)``, in this
    exact op order per element, in float64 (the new ``v`` is used unrounded in the ``θ`` update), each result
    rounded once into ``v``'s and ``θ``'s dtype (the canonical state and the working state must round alike)."""
    outer_step(Nesterov(mu), theta, v, u, scales, eta)


def mean_step(slot: LiveSlot, name: str, theta: np.ndarray, v: np.ndarray, eta: float, rule: OuterRule) -> None:
    """:func:`outer_step` of a mean-aggregated tensor (flat ``theta``, ``v``) with ``slot``'s canonical
    aggregate, summed and stepped span by span: its scale (1 / Σ w) needs no norm, so no temporary of the
    tensor's size (the embeddings are the largest tensors); the same bits, every operation being
    elementwise. The slot's kept sum, if it keeps one, is written on the way."""
    scale = slot.terms(name).scale(0.0)
    kept, parts = slot.kept_buffer(name), []
    kept_flat = None if kept is None else kept.reshape(-1)
    for span, uc, part in canonical_spans(slot.entries, name, slot.config, theta.size, sums=slot.screen):
        parts.append(part)
        if kept_flat is not None:
            kept_flat[span] = uc
        rule.step(theta[span], v[span], uc, scale, eta)
    if kept is not None:
        slot.set_kept(name, kept, math.sqrt(math.fsum(parts)))


def step_slots(rule: OuterRule, config: LedgerConfig, shapes: Mapping[str, tuple[int, ...]], theta: Arrays,
               v: Arrays, slots: Sequence[LiveSlot], settle: Callable[[Iterable[SlotEntry]], None],
               after: Callable[[str], None] | None = None) -> None:
    """Step ``(theta, v)`` in place with each of ``slots``' canonical aggregates in turn, by ``rule``, tensor by
    tensor in parallel threads (a tensor goes through every slot before the next: one sweep over the state for
    several slots; the bits are those of one step after the other, every operation being per tensor).
    ``settle(entries)`` follows each slot's pass over a tensor (what a pass holds does not grow with the
    peers); ``after(name)`` follows a tensor's last slot. A radial tensor's scale needs ``‖u‖`` first, so its
    ``u`` is computed into a float64 temporary of its size; a mean tensor's scale does not (e.g. the
    embeddings, the largest tensors), so it is summed and stepped span by span (:func:`mean_step`)."""

    def one(name: str) -> None:
        u = np.empty(shapes[name], dtype=np.float64) if uses_radial(name, config) else None
        for slot in slots:
            eta = config.eta(slot.slot)
            if u is not None:
                _, scale = slot.canonical_tensor(name, u)
                outer_step(rule, {name: theta[name]}, {name: v[name]}, {name: u}, {name: scale}, eta)
            else:
                mean_step(slot, name, flat(theta[name]), flat(v[name]), eta, rule)
            settle(slot.entries)
        if after is not None:
            after(name)

    parallel_map(one, shapes)


def fold_coefficients(r: int, n: int, eta: Callable[[int], float], mu: float) -> tuple[float, float]:
    """``(μ^{n−r}, η_r (1+μ) + Σ_{t=r+1..n} η_t μ^{t−r+1})``: the factors by which a change ``δ`` of slot
    ``r``'s aggregate moves ``v_n`` (added) and ``θ_n`` (subtracted), for closed slots ``1 ≤ r ≤ n``
    (Nesterov's :meth:`~protocol.ledger.rules.OuterRule.fold_coefficients`)."""
    return Nesterov(mu).fold_coefficients(r, n, eta)


def fold_change(
    theta: np.ndarray,
    v: np.ndarray,
    u: np.ndarray,
    name: str,
    change: TermChange,
    v_coef: float,
    theta_coef: float,
) -> None:
    """Fold the change of tensor ``name`` of a past slot's aggregate into ``θ_n, v_n`` (in place), where
    that slot's accumulator ``u`` receives ``Σ_j Δc_j·Δ_j`` (``change.terms``, usually the late update's
    one term): ``δ = s_new·(u + Σ Δc_j·Δ_j) − s_old·u``, evaluated as ``(s_new − s_old)·u + s_new·Σ Δc_j·Δ_j``
    from ``u`` *before* the add (well conditioned whether the new update dominates the slot or not; from
    the sum after it, a light slot that receives a heavy update loses digits to cancellation);
    ``v += v_coef·δ``; ``θ −= theta_coef·δ``. Then ``u += Σ Δc_j·Δ_j`` in the same pass (``u`` is the
    slot's float32 kept sum or a float64 rebuilt one)."""
    a, k = _F64(v_coef), _F64(theta_coef)
    alpha = _F64(change.s_new - change.s_old)
    terms = [(deltas, _F64(c), _F64(change.s_new * c)) for deltas, c in change.terms if c != 0.0]
    # Scale δ in place twice (δ·a, then ·k/a) unless a is so small that δ·a could lose bits to underflow.
    reuse = float(a) >= 1e-30 and math.isfinite(float(k) / float(a))
    ratio = float(k) / float(a) if reuse else 0.0
    thf, vf, uf = np.asarray(flat(theta)), np.asarray(flat(v)), np.asarray(flat(u))
    buf = np.empty(min(CHUNK, thf.size))
    for s in spans(thf.size):  # compiled (protocol.kernels), in this op order per element
        d = buf[: s.stop - s.start]
        fold_start(uf[s], d, alpha)
        for deltas, c, beta in terms:
            fold_term(uf[s], d, span_of(deltas, name, s), c, beta)  # the slot's sum takes the term
        fold_finish(thf[s], vf[s], d, a, ratio if reuse else k, reuse)
