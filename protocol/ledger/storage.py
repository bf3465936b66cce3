"""Where a ledger keeps the arrays only its rare paths read: the window bottom ``θ_b, v_b``.

The ledger's state (the bottom and the working ``θ_n, v_n``) is :data:`STATE_DTYPE`, float32: the
dtype the island trains in; every outer computation runs in float64 and rounds once into it
(:mod:`protocol.ledger.outer`). The bottom is read and written once per sweep over the slots that left the
window since the last (``Ledger.advance_bottom``), and read when the window is replayed (a restore), for a snapshot and for the bottom digest: a pass over
8 bytes per parameter now and then, never per update. A :class:`BottomStore` hands the ledger its arrays and hears when a pass is over
(:meth:`~BottomStore.settle`), so an implementation can keep them in memory-mapped files and let their
pages go between passes (``node.outer.outer_files.MappedBottom``): the bottom then costs the process no resident
memory between passes. The ledger stays free of I/O: it only calls these two methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import numpy as np

from protocol.ledger.fields import bad_state

__all__ = ["BottomStore", "InMemory", "STATE_DTYPE", "owned_working_state", "state_copy"]

#: The dtype of the ledger's parameters and momentum (working state, window bottom, snapshots).
STATE_DTYPE = np.dtype(np.float32)


class BottomStore(Protocol):
    def allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        """A fresh writable C-contiguous :data:`STATE_DTYPE` array of ``shape`` (contents undefined)."""
        ...

    def settle(self, arrays: Iterable[np.ndarray | memoryview]) -> None:
        """A pass over ``arrays`` is over: their memory may leave the process until the next access,
        which must see the same values. They are arrays allocated here, or the data of entries' payloads
        (which a node maps from its blob files: their pages may go too)."""
        ...


class InMemory:
    """The default: plain numpy arrays; settling does nothing."""

    def allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.empty(shape, dtype=STATE_DTYPE)

    def settle(self, arrays: Iterable[np.ndarray | memoryview]) -> None:
        pass


def state_copy(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Fresh C-contiguous :data:`STATE_DTYPE` copies of ``arrays``."""
    return {name: np.array(a, dtype=STATE_DTYPE, copy=True, order="C") for name, a in arrays.items()}


def owned_working_state(arrays: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]], what: str) -> dict[str, np.ndarray]:
    """A working state handed to ``Ledger.from_snapshot``, owned by the ledger from now on: its arrays when
    they are float32, C-contiguous, writable and own their memory, else copies; ``BAD_STATE`` for other names
    or shapes, or a non-finite value."""
    if sorted(arrays) != sorted(shapes):
        raise bad_state(f"working {what} names differ from the snapshot's")
    out = {}
    for name, a in arrays.items():
        if tuple(np.shape(a)) != tuple(shapes[name]):
            raise bad_state(f"working {what}[{name}]: shape {np.shape(a)}, the snapshot's is {tuple(shapes[name])}")
        owned = isinstance(a, np.ndarray) and a.dtype == STATE_DTYPE and a.flags.c_contiguous \
            and a.flags.writeable and a.flags.owndata
        out[name] = a if owned else np.array(a, dtype=STATE_DTYPE, copy=True, order="C")
        if not np.isfinite(out[name]).all():
            raise bad_state(f"working {what}[{name}] has non-finite values")
    return out
