"""Where a ledger keeps the arrays only its rare paths read: the window bottom ``θ_b, v_b`` (float64).

The bottom is read and written once each time a slot leaves the window, and read when the window is
replayed (a restore), for a snapshot and for the bottom digest: a pass over 16 bytes per parameter now and
then, never per update. A :class:`BottomStore` hands the ledger its arrays and hears when a pass is over
(:meth:`~BottomStore.settle`), so an implementation can keep them in memory-mapped files and let their
pages go between passes (``node.outer_files.MappedBottom``): the bottom then costs the process no resident
memory between passes. The ledger stays free of I/O: it only calls these two methods.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np

__all__ = ["BottomStore", "InMemory"]


class BottomStore(Protocol):
    def allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        """A fresh writable C-contiguous float64 array of ``shape`` (contents undefined)."""
        ...

    def settle(self, arrays: Iterable[np.ndarray]) -> None:
        """A pass over ``arrays`` (allocated here) is over: their memory may leave the process until the
        next access, which must see the same values."""
        ...


class InMemory:
    """The default: plain numpy arrays; settling does nothing."""

    def allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.empty(shape, dtype=np.float64)

    def settle(self, arrays: Iterable[np.ndarray]) -> None:
        pass
