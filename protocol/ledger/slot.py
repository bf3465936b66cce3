"""A live slot (in the window, or open): the entries applied at it, and its aggregate computed on demand.

Its aggregate, tensor by tensor, is ``scale(name) · u[name]`` (see :mod:`protocol.ledger.aggregate`) with
``u`` recomputed *canonically* (entries in ``update_id`` order) from the entries' deltas (their payloads,
decoded span by span) whenever the ledger needs it: when the slot closes, when it leaves the window, when
the window is replayed, and when a late update reaches it (:meth:`LiveSlot.change_by`). So the ledger
holds one float64 temporary per tensor in flight instead of running sums per slot, and a closing slot
steps the working state with exactly the canonical aggregate.

One exception, for speed: the newest closed slot, where late updates almost always land (testnet
reports), keeps its sum rounded to float32 (:meth:`LiveSlot.keep`, 4 bytes per parameter) with its float64
norm, so a late update costs one pass over the model instead of decoding every payload of the slot. That
sum feeds only the working state's fold (whose rounding is float32 anyway); the canonical state never
reads it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from protocol.ledger.aggregate import (
    ScreenCache, SlotEntry, accumulate_sorted, bound_terms, norm_with_terms, screen_estimate, tensor_terms,
)
from protocol.ledger.screen_bounds import along_kept, extend, kept_interval
from protocol.ledger.config import LedgerConfig

__all__ = ["LiveSlot", "TermChange"]


#: One changed term of a tensor's accumulator: an entry's deltas (float32 arrays or a payload) and the
#: change of its coefficient ``c_new − c_old``.
Term = tuple[Mapping[str, np.ndarray], float]


@dataclass(frozen=True)
class TermChange:
    """How adding one entry changes a tensor's aggregate: ``g_new − g_old = (s_new − s_old)·u +
    s_new·Σ_j Δc_j·Δ_j`` with ``u`` the accumulator before the add, whose norm after the add is ``norm``.
    ``terms`` are the new entry's (``Δc`` = its coefficient) and, when the add moved the norm bound across
    another entry's norm or displaced an entry of its origin (:mod:`protocol.ledger.bound`), theirs."""

    terms: tuple[Term, ...]
    s_old: float
    s_new: float
    norm: float = 0.0
    taken: float = 0.0  # Σ |Δc|·‖Δ‖ over the terms that shrank or left: the rounding they leave in a kept sum


#: A kept float32 sum is used for a fold only while ``Σ|c_i|·‖Δ_i‖ ≤ KEPT_CONDITION · ‖u‖``, the terms
#: that left it or shrank in it since it was last computed canonically counted too (their rounding stays
#: behind): its rounding (~6e-8 of the terms) then stays within ~1e-6 of the sum. Updates that cancel (rare
#: in training, where pseudo-gradients agree more than they oppose) make the fold rebuild the sum
#: canonically in float64.
KEPT_CONDITION = 16.0
#: ... and while a late update leaves each other coefficient at least 1/KEPT_SHRINK of what it was (the
#: rounding the sum kept of a term then stays within ~1e-6 of that term's new size).
KEPT_SHRINK = 16.0
#: A fold reads ``‖U‖²`` from the screen's bounds of the new set when they hold it within this (relative):
#: a fast estimate's (~1e-11) does; a chained certificate's (wide) does not.
ESTIMATED_NORM = 1e-9


def _well_conditioned(entries: list[SlotEntry], name: str, config: LedgerConfig, norm: float,
                      sums: ScreenCache, residue: float = 0.0) -> bool:
    coefficients = tensor_terms(entries, name, config, sums).coefficients
    terms = math.fsum(abs(coefficients[e.meta.update_id]) * e.norms[name] for e in entries)
    return terms + residue <= KEPT_CONDITION * norm


class LiveSlot:
    """The entries of one slot and, while it is the newest closed slot, its kept float32 sums; owned by a
    :class:`Ledger`."""

    def __init__(
        self, slot: int, shapes: Mapping[str, tuple[int, ...]], config: LedgerConfig, entries: Iterable[SlotEntry] = ()
    ) -> None:
        self.slot = slot
        self.config = config
        self.shapes = dict(shapes)
        self.entries: list[SlotEntry] = list(entries)
        self.kept: dict[str, tuple[np.ndarray, float]] = {}  # name → (float32 sum u, ‖u‖ in float64)
        self.screen = ScreenCache()  # the sums the direction screen read of this slot's sets
        self.keeping = False
        # name → (a late entry's id, ⟨kept sum, its Δ⟩), taken by the certificate (:meth:`_certify`) and read
        # once by the same fold's :meth:`change_by`; each tensor's fold runs in one thread, tensors in several
        self._along: dict[str, tuple[bytes, float]] = {}
        # name → Σ |Δc|·‖Δ‖ of the terms that left or shrank in the kept sum since it was computed canonically
        self._residue: dict[str, float] = {}

    def keep(self, buffers: dict[str, tuple[np.ndarray, float]] | None = None) -> None:
        """From now on, keep the sums (written by :meth:`canonical_tensor` and :meth:`change_by`);
        ``buffers`` (another slot's :meth:`release`) are reused."""
        self.keeping = True
        self.kept = buffers or {}

    def release(self) -> dict[str, tuple[np.ndarray, float]]:
        """Stop keeping the sums; returns their buffers for reuse."""
        kept, self.kept, self.keeping = self.kept, {}, False
        self._residue = {}
        return kept

    def kept_buffer(self, name: str) -> np.ndarray | None:
        """Where tensor ``name``'s sum is kept (a float32 array; its norm is set by :meth:`set_kept`), or
        None when this slot keeps no sums."""
        if not self.keeping:
            return None
        return self.kept[name][0] if name in self.kept else np.empty(self.shapes[name], dtype=np.float32)

    def set_kept(self, name: str, buffer: np.ndarray, norm: float) -> None:
        self.kept[name] = (buffer, norm)

    def _store(self, name: str, u: np.ndarray, norm: float) -> None:
        buf = self.kept_buffer(name)
        if buf is not None:
            if buf is not u:
                np.copyto(buf, u, casting="same_kind")
            self.set_kept(name, buf, norm)

    def ids(self) -> list[bytes]:
        return [e.meta.update_id for e in self.entries]

    def canonical_tensor(self, name: str, out: np.ndarray) -> tuple[float, float]:
        """Write tensor ``name``'s canonical ``u`` into the float64 array ``out`` (and keep it, rounded, if
        this slot keeps its sums); return (``‖u‖``, scale)."""
        norm = accumulate_sorted(self.entries, self.config, {name: out}, self.screen)[name]
        self._store(name, out, norm)
        self._residue.pop(name, None)
        return norm, self.terms(name).scale(norm)

    def terms(self, name: str, extra: SlotEntry | None = None):
        """Tensor ``name``'s terms over this slot's entries (and ``extra``, a late one about to join)."""
        return tensor_terms(self.entries if extra is None else [*self.entries, extra], name, self.config, self.screen)

    def fold(self, name: str, entry: SlotEntry, now: Mapping[str, np.ndarray]) -> tuple[np.ndarray, TermChange]:
        """For the fold of a late ``entry`` (its tensors to apply: ``now``): the array tensor ``name``'s sum is
        in (:meth:`fold_sum`) and how the aggregate changes (:meth:`change_by`). A kept sum that would be left
        too small for the rounding it carries (a term taken away, the rest nearly cancelling: ``Σ|c_i|·‖Δ_i‖``
        of the new set and what left, over ``KEPT_CONDITION`` times its new norm) is given up for a rebuilt
        one."""
        u = self.fold_sum(name, entry)
        change = self.change_by(entry, name, now, u)
        if self._is_kept(name, u) and change.taken:
            terms = tensor_terms([*self.entries, entry], name, self.config, self.screen).coefficients
            size = math.fsum(abs(c) * e.norms[name] for e in [*self.entries, entry] if (c := terms[e.meta.update_id]))
            if size + self._residue.get(name, 0.0) + change.taken > KEPT_CONDITION * change.norm:
                u = np.empty(self.shapes[name], dtype=np.float64)
                change = self.change_by(entry, name, now, u)
        return u, change

    def _is_kept(self, name: str, u: np.ndarray) -> bool:
        return name in self.kept and self.kept[name][0] is u

    def fold_sum(self, name: str, entry: SlotEntry) -> np.ndarray:
        """The array the fold of a late ``entry``'s tensor ``name`` works in (:meth:`change_by`): the kept
        float32 sum itself if it is well conditioned and ``entry`` shrinks no other entry's coefficient by
        more than ``KEPT_SHRINK`` without taking it away (moving the norm bound, as a mean tensor's clipped
        coefficients move with the median, changes them a little; displacing its origin's entry or screening
        one out takes a term away: :meth:`fold` then checks that the sum left is not too small for the
        rounding that term leaves behind), else a new float64 array the sum is rebuilt in."""
        if name in self.kept and _well_conditioned(self.entries, name, self.config, self.kept[name][1], self.screen,
                                                   self._residue.get(name, 0.0)):
            self._certify(name, entry)
            old, new = self.terms(name).coefficients, self.terms(name, entry).coefficients
            if all(new[i] == c or new[i] == 0.0 or (c * new[i] > 0.0 and KEPT_SHRINK * abs(new[i]) >= abs(c))
                   for i, c in old.items()):
                return self.kept[name][0]
        return np.empty(self.shapes[name], dtype=np.float64)

    def _certify(self, name: str, entry: SlotEntry) -> None:
        """Before a late ``entry`` joins: try to prove that the direction screen of the new set keeps
        everyone, with less work than the screen's exact pass over the slot's payloads.

        For an entry of an origin new to this slot, without decoding the slot's payloads
        (:mod:`protocol.ledger.screen_bounds`: from the sums of the current set, the kept sum and the new
        update, in one pass over those two): only when the current set's screen kept everyone (the kept sum
        is then the sum over its live terms) and every term stays live (the entry may move the others'
        coefficients through the norm bound, as it does for a mean tensor's clipped ones). Otherwise (the
        entry displaces its origin's first: a term leaves), or when those bounds do not clear the threshold,
        from a fast estimate of the new set's sums (:func:`~protocol.ledger.aggregate.screen_estimate`, ~5×
        cheaper than the exact pass). When neither proves it, the screen takes its exact sums as before."""
        config = self.config
        if config.direction_screen is None or config.norm_clip == 0.0:
            return
        joined = tensor_terms([*self.entries, entry], name, config, screen=False).coefficients
        if not self._certify_by_bounds(name, entry, joined):
            self._certify_by_estimate(name, entry, joined)

    def _certify_by_estimate(self, name: str, entry: SlotEntry, joined: Mapping[bytes, float]) -> None:
        live = [(e, c) for e in sorted([*self.entries, entry], key=lambda e: e.meta.update_id)
                if (c := joined[e.meta.update_id]) != 0.0]
        if len(live) < 3 or self.screen.get(name, live) is not None or self.screen.certified(name, live):
            return
        bounds = screen_estimate(live, name, math.prod(self.shapes[name]))
        if bounds is not None:
            self.screen.certify(name, live, bounds, self.config.direction_screen)

    def _certify_by_bounds(self, name: str, entry: SlotEntry, joined: Mapping[bytes, float]) -> bool:
        """The certificate of a late entry of a new origin (:meth:`_certify`); whether it proved the verdict."""
        config = self.config
        before = tensor_terms(self.entries, name, config, screen=False).coefficients
        if self.terms(name).coefficients != before:
            return False
        c_new = joined[entry.meta.update_id]
        if not c_new > 0.0 or any((joined[i] == 0.0) != (c == 0.0) for i, c in before.items()):
            return False
        by_id = {e.meta.update_id: e for e in self.entries}
        live = [(by_id[i], c) for i, c in sorted(before.items()) if c != 0.0]
        bounds = self.screen.bounds(name, live)
        if bounds is None:
            return False
        y = along_kept(self.kept[name][0], entry.deltas, name)
        self._along[name] = (entry.meta.update_id, y)
        terms, norm = bound_terms(live, name), entry.norms[name]
        changes = {i: joined[i] - c for i, c, _ in terms if joined[i] != c}
        grown = extend(bounds, terms, (entry.meta.update_id, c_new, norm),
                       kept_interval(y, norm, terms, folds=len(self.entries) + 1), changes)
        grown_live = sorted([*((e, joined[e.meta.update_id]) for e, _ in live), (entry, c_new)],
                            key=lambda t: t[0].meta.update_id)
        return self.screen.certify(name, grown_live, grown, config.direction_screen)

    def change_by(self, entry: SlotEntry, name: str, now: Mapping[str, np.ndarray], u: np.ndarray) -> TermChange:
        """For a late ``entry`` whose tensors to apply are ``now``: how tensor ``name``'s aggregate changes
        when ``entry`` joins (``u``, from :meth:`fold_sum`, is the slot's sum before: the kept sum, or the
        canonical sum rebuilt here into the float64 ``u``). ``u`` is not changed here: the fold adds the
        terms (``protocol.ledger.outer.fold_change``), then :meth:`took` records the new sum."""
        if self._is_kept(name, u):
            norm_old = self.kept[name][1]
        else:
            norm_old = accumulate_sorted(self.entries, self.config, {name: u}, self.screen)[name]
        old, new = self.terms(name), self.terms(name, entry)
        changed = [e for e in sorted(self.entries, key=lambda e: e.meta.update_id)
                   if new.coefficients[e.meta.update_id] != old.coefficients[e.meta.update_id]]
        terms: list[Term] = [(e.deltas, new.coefficients[e.meta.update_id] - old.coefficients[e.meta.update_id])
                             for e in changed]
        taken = math.fsum(abs(c) * e.norms[name] for e, (_, c) in zip(changed, terms) if c < 0.0)
        if (c := new.coefficients[entry.meta.update_id]) != 0.0:
            terms.append((now, c))
        norm = norm_old if not terms else self._norm_from_kept(name, entry, u, terms, now, norm_old)
        if norm is None and self._is_kept(name, u):
            norm = self._norm_from_screen(name, entry, old.coefficients, new.coefficients)
        if norm is None:
            norm = norm_with_terms(u, name, terms)
        return TermChange(terms=tuple(terms), s_old=old.scale(norm_old), s_new=new.scale(norm), norm=norm, taken=taken)

    def _norm_from_kept(self, name: str, entry: SlotEntry, u: np.ndarray, terms: list[Term],
                        now: Mapping[str, np.ndarray], norm_old: float) -> float | None:
        """``‖u + c·Δ‖`` when ``u`` is the kept sum and the late ``entry``'s is the only term, from one inner
        product ``y = ⟨u, Δ⟩`` (the certificate's, :meth:`_certify`, when it took it: then no pass at all):
        ``√(‖u‖² + 2c·y + c²‖Δ‖²)``. ``‖u‖`` is the kept norm (of the float64 sum before its rounding to
        float32, within ~1e-6 of the kept sum's own: :data:`KEPT_CONDITION`), so the result is within a few
        1e-6 of the norm a pass over ``u + c·Δ`` measures, as long as ``u`` and ``c·Δ`` do not cancel: None
        (measure it) when the square falls below half of ``‖u‖² + c²‖Δ‖²``. Only the working state reads
        it (the fold's scale, the kept norm); the canonical state computes every norm from the payloads."""
        along = self._along.pop(name, None)
        if len(terms) != 1 or terms[0][0] is not now or name not in self.kept or self.kept[name][0] is not u:
            return None
        y = along[1] if along is not None and along[0] == entry.meta.update_id else along_kept(u, entry.deltas, name)
        c, size = terms[0][1], entry.norms[name]
        squared = norm_old * norm_old + 2.0 * c * y + (c * size) ** 2
        if not squared >= 0.5 * (norm_old * norm_old + (c * size) ** 2):
            return None
        return math.sqrt(squared)

    def _norm_from_screen(self, name: str, entry: SlotEntry, before: Mapping[bytes, float],
                          joined: Mapping[bytes, float]) -> float | None:
        """``‖U‖`` of the set with the late ``entry`` in (``joined``: its coefficients; ``before``: the set's
        without it), from what the direction screen took of that set, when the late update takes a live term
        away (it displaces its origin's first update) and the screen left every term in (then its ``U`` is the
        set's): its exact sums (:func:`~protocol.ledger.aggregate.screen_pass`, canonical) or its fast estimate
        (:meth:`_certify`; within ~1e-11 of the exact ``‖U‖²``, far inside the float32 rounding a fold
        leaves); None otherwise. Either way every payload of the slot was read for that set already, in
        every replica alike, so the norm costs no pass of its own. Only the working state reads it (the
        fold's scale, the kept norm)."""
        if not any(c != 0.0 and joined[i] == 0.0 for i, c in before.items()):
            return None  # no term left: the set may have been certified without sums
        if tensor_terms([*self.entries, entry], name, self.config, screen=False).coefficients != joined:
            return None  # the screen left a term out: its first sums are not the set's
        live = [(e, c) for e in sorted([*self.entries, entry], key=lambda e: e.meta.update_id)
                if (c := joined[e.meta.update_id]) != 0.0]
        if not live:
            return None
        sums = self.screen.get(name, live)
        if sums is not None:
            return math.sqrt(sums.u_squared)
        bounds = self.screen.bounds(name, live)
        squared = None if bounds is None else bounds.u_squared_within(ESTIMATED_NORM)
        return None if squared is None else math.sqrt(squared)

    def took(self, name: str, u: np.ndarray, change: TermChange) -> None:
        """``u`` now holds the slot's sum with the late entry's term (:meth:`change_by`): keep it (a kept sum
        changed in place keeps the rounding of the terms that left or shrank in it; a rebuilt one is new)."""
        residue = self._residue.get(name, 0.0) + change.taken if self._is_kept(name, u) else 0.0
        self._store(name, u, change.norm)
        self._residue[name] = residue

    def add(self, entry: SlotEntry) -> None:
        self.entries.append(entry)
