"""The window bottom: the state ``θ_base, v_base`` below the ledger's window, and the slots on their way into it.

A :class:`~protocol.ledger.ledger.Ledger` replays its canonical state from here, digests it (the bottom's
tree digest, :mod:`protocol.ledger.digest`) and snapshots it. The arrays are float32 arrays of a
:class:`~protocol.ledger.storage.BottomStore` (a node's: memory-mapped files, resident only during a pass).

A slot that leaves the window is *queued* (:meth:`WindowBottom.queue`) and stepped into the arrays later, by
:meth:`WindowBottom.advance` with the ledger's canonical step, all queued slots in one sweep over the arrays
(each tensor read, stepped slot after slot, hashed and written back once). The bottom is logically at the
ledger's ``base_slot`` from the moment a slot is queued: every reader advances it first (the ledger's job),
so no result depends on when the sweep runs.

Owned by its ledger (not thread-safe, as the ledger).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from protocol.ledger import digest as dg
from protocol.ledger.slot import LiveSlot
from protocol.ledger.storage import BottomStore, InMemory, state_copy

__all__ = ["BottomStep", "WindowBottom"]

# The ledger's canonical step: (theta, v, slots, rows) steps theta and v with each slot in turn and, given
# rows, hashes every stepped tensor into them (``"theta/<name>"``, ``"momentum/<name>"``) and settles it.
BottomStep = Callable[[dict[str, np.ndarray], dict[str, np.ndarray], list[LiveSlot], dict[str, dg.Row]], None]

State = dict[str, np.ndarray]


class WindowBottom:
    """``θ_base, v_base`` in a bottom store, the slots queued for them, and their digest rows."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], theta: Mapping[str, np.ndarray],
                 v: Mapping[str, np.ndarray], store: BottomStore | None = None) -> None:
        """Copies ``theta`` and ``v`` (any float dtype; 0-d arrays broadcast) into arrays of ``store``."""
        self.store = store or InMemory()
        self._shapes = dict(shapes)
        self._theta, self._v = self.copy_of(theta), self.copy_of(v)
        self._rows: list[dg.Row] | None = None  # hashed by the sweep, or on the first request after a restore
        self._queued: list[LiveSlot] = []

    @property
    def behind(self) -> int:
        """Slots queued and not yet stepped into the arrays."""
        return len(self._queued)

    def queue(self, slot: LiveSlot) -> None:
        """``slot`` left the window (its set is final): step the arrays with it at the next :meth:`advance`."""
        self._queued.append(slot)

    def advance(self, step: BottomStep) -> int:
        """Step the arrays with every queued slot in one sweep (``step``, the ledger's canonical step), keeping
        the rows it hashes. Returns how many slots it stepped (0: nothing to do)."""
        queued, count = self._queued, len(self._queued)
        if queued:
            rows: dict[str, dg.Row] = {}
            step(self._theta, self._v, queued, rows)
            self._rows = [rows[name] for name in sorted(rows)]
            self._queued = []
        return count

    def rows(self) -> list[dg.Row]:
        """The bottom digest's rows (each array's piece hashes), as of the last :meth:`advance`: the sweep's,
        or hashed now (the first call after a restore) and kept."""
        if self._rows is None:
            arrays = {**{"theta/" + n: a for n, a in self._theta.items()},
                      **{"momentum/" + n: a for n, a in self._v.items()}}
            self._rows = dg.tree_rows(arrays, after=lambda a: self.store.settle((a,)))
        return self._rows

    def state(self) -> tuple[State, State]:
        """Copies of ``θ_base, v_base`` in ordinary memory (the start of a canonical replay)."""
        theta, v = state_copy(self._theta), state_copy(self._v)
        self._settle()
        return theta, v

    def store_copies(self) -> tuple[State, State]:
        """Copies of ``θ_base, v_base`` in fresh arrays of the store (a snapshot's: no resident memory once
        written out, in a node's)."""
        theta, v = self.copy_of(self._theta), self.copy_of(self._v)
        self._settle()
        return theta, v

    def copy_of(self, arrays: Mapping[str, np.ndarray]) -> State:
        """``arrays`` (any float dtype; 0-d broadcasts) copied into fresh float32 arrays of the store, tensor
        by tensor, each copy and its source settled once copied."""
        out = {}
        for name, shape in self._shapes.items():
            out[name] = self.store.allocate(shape)
            np.copyto(out[name], arrays[name], casting="same_kind")
            self.store.settle((out[name], arrays[name]))
        return out

    def _settle(self) -> None:
        self.store.settle([*self._theta.values(), *self._v.values()])
