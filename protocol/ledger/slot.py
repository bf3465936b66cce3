"""A live slot (in the window, or open): its entries and the running float64 accumulators.

The working aggregate of tensor ``name`` is ``scale(name) · u[name]`` (see :mod:`protocol.ledger.aggregate`).
``u`` is a running sum in arrival order; :meth:`LiveSlot.canonical_into` recomputes it canonically.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from protocol.ledger.aggregate import SlotEntry, accumulate_sorted, add_term, coefficient, slot_scale
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
    """Entries of one slot plus ``u`` (float64 per tensor) and ``‖u‖``; owned by a :class:`Ledger`."""

    def __init__(
        self,
        slot: int,
        shapes: Mapping[str, tuple[int, ...]],
        config: LedgerConfig,
        entries: Iterable[SlotEntry] = (),
        buffers: dict[str, np.ndarray] | None = None,
    ) -> None:
        """A slot holding ``entries`` (accumulated canonically); ``buffers`` (float64 arrays of the right
        shapes, e.g. a retired slot's ``u``) are reused and overwritten instead of allocating."""
        self.slot = slot
        self.config = config
        self.entries: list[SlotEntry] = list(entries)
        self.u = (
            buffers
            if buffers is not None
            else {name: np.empty(shape, dtype=np.float64) for name, shape in shapes.items()}
        )
        self.u_norm = accumulate_sorted(self.entries, config, self.u)

    def scale(self, name: str) -> float:
        return slot_scale(self.entries, name, self.config, self.u_norm[name])

    def scales(self) -> dict[str, float]:
        return {name: self.scale(name) for name in self.u}

    def ids(self) -> list[bytes]:
        return [e.meta.update_id for e in self.entries]

    def add(self, entry: SlotEntry) -> dict[str, TermChange]:
        """Apply ``entry`` here: ``u += c·Δ`` per tensor; returns how each tensor's aggregate changed."""
        changes = {}
        after = [*self.entries, entry]
        for name, u in self.u.items():
            s_old = self.scale(name)
            c = coefficient(entry, name, self.config)
            self.u_norm[name] = add_term(u, entry.deltas[name], c)
            changes[name] = TermChange(
                c=c, s_old=s_old, s_new=slot_scale(after, name, self.config, self.u_norm[name])
            )
        self.entries = after
        return changes

    def canonical_into(self, out: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Write the canonical ``u`` into ``out``; return the canonical scales."""
        norms = accumulate_sorted(self.entries, self.config, out)
        return {name: slot_scale(self.entries, name, self.config, norms[name]) for name in out}
