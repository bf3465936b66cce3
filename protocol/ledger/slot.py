"""A live slot (in the window, or open): its entries and, while it keeps them, its running float64 sums.

The working aggregate of tensor ``name`` is ``scale(name) · u[name]`` (see :mod:`protocol.ledger.aggregate`).
``u`` is a running sum in arrival order, kept only where late updates usually land (the ledger decides:
the open slot and the newest closed ones); a slot without it keeps ``‖u‖`` and rebuilds ``u`` canonically
from its entries when an update reaches it (:meth:`LiveSlot.add`), at the cost of decoding them.
:meth:`LiveSlot.canonical_tensor` recomputes one tensor's ``u`` canonically.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from protocol.ledger.aggregate import SlotEntry, accumulate_sorted, add_term, coefficient, slot_scale
from protocol.parallel import parallel_map
from protocol.ledger.config import LedgerConfig

__all__ = ["LiveSlot", "TermChange"]


@dataclass(frozen=True)
class TermChange:
    """How adding one entry changed a tensor's aggregate: ``g_new − g_old = (s_new − s_old)·u + s_old·c·Δ``
    with ``u`` the accumulator after the add."""

    c: float
    s_old: float
    s_new: float


class LiveSlot:
    """Entries of one slot plus ``u`` (float64 per tensor, or ``None`` once released) and ``‖u‖``; owned by
    a :class:`Ledger`."""

    def __init__(
        self,
        slot: int,
        shapes: Mapping[str, tuple[int, ...]],
        config: LedgerConfig,
        entries: Iterable[SlotEntry] = (),
        buffers: dict[str, np.ndarray] | None = None,
        keep_sums: bool = True,
    ) -> None:
        """A slot holding ``entries`` (accumulated canonically). ``buffers`` (float64 arrays of the right
        shapes, e.g. a released slot's ``u``) are reused and overwritten instead of allocating; with
        ``keep_sums=False`` only the norms are kept (``u`` is built tensor by tensor and dropped)."""
        self.slot = slot
        self.config = config
        self.shapes = dict(shapes)
        self.entries: list[SlotEntry] = list(entries)
        self.u: dict[str, np.ndarray] | None = None
        if keep_sums:
            self.u_norm = self._build(buffers)
        else:
            names = list(self.shapes)
            norms = parallel_map(lambda name: self.canonical_tensor(name, np.empty(self.shapes[name]))[0], names)
            self.u_norm = dict(zip(names, norms, strict=True))

    def _build(self, buffers: dict[str, np.ndarray] | None = None) -> dict[str, float]:
        if buffers is None:
            buffers = {name: np.empty(shape, dtype=np.float64) for name, shape in self.shapes.items()}
        self.u = buffers
        return accumulate_sorted(self.entries, self.config, self.u)

    def release(self) -> dict[str, np.ndarray] | None:
        """Drop the running sums (the norms stay); returns their buffers for reuse."""
        u, self.u = self.u, None
        return u

    def scale(self, name: str) -> float:
        return slot_scale(self.entries, name, self.config, self.u_norm[name])

    def scales(self) -> dict[str, float]:
        return {name: self.scale(name) for name in self.shapes}

    def ids(self) -> list[bytes]:
        return [e.meta.update_id for e in self.entries]

    def add(self, entry: SlotEntry, deltas: Mapping[str, np.ndarray]) -> dict[str, TermChange]:
        """Apply ``entry``, whose deltas are the arrays ``deltas``, here: ``u += c·Δ`` per tensor (``u`` is
        rebuilt canonically first if it was released); returns how each tensor's aggregate changed."""
        if self.u is None:
            self.u_norm = self._build()
        after = [*self.entries, entry]

        def one(name: str) -> tuple[float, TermChange]:
            s_old = self.scale(name)
            c = coefficient(entry, name, self.config)
            norm = add_term(self.u[name], deltas[name], c)
            return norm, TermChange(c=c, s_old=s_old, s_new=slot_scale(after, name, self.config, norm))

        names = list(self.u)
        changes = {}
        for name, (norm, change) in zip(names, parallel_map(one, names), strict=True):
            self.u_norm[name], changes[name] = norm, change
        self.entries = after
        return changes

    def canonical_tensor(self, name: str, out: np.ndarray) -> tuple[float, float]:
        """Write tensor ``name``'s canonical ``u`` into the float64 array ``out``; return (``‖u‖``, scale)."""
        norm = accumulate_sorted(self.entries, self.config, {name: out})[name]
        return norm, slot_scale(self.entries, name, self.config, norm)
