"""Memory-mapped files for the ledger's window bottom (`protocol.ledger.storage.BottomStore`).

Each array is a shared mapping of its own file in the node's data directory, unlinked as soon as it is
mapped: the kernel keeps the file while the mapping lives and frees its disk space when the ledger drops
the array, so a crash leaves nothing behind. After each of the ledger's passes over the bottom (once per
slot that leaves the window) `settle` tells the kernel the pages may go (`MADV_DONTNEED`): written-back
file pages, not the process's memory, until the next pass reads them again. Thread-safety: `allocate` and
`settle` are called by the ledger's one user (the replica's worker thread).
"""

from __future__ import annotations

import math
import mmap
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np

__all__ = ["MappedBottom"]


def _mapping(a: object) -> mmap.mmap | None:
    """The mmap under an array made by `MappedBottom.allocate` (through its views), or None."""
    while a is not None and not isinstance(a, mmap.mmap):
        a = a.obj if isinstance(a, memoryview) else getattr(a, "base", None)
    return a


class MappedBottom:
    """A `BottomStore` whose arrays live in memory-mapped files under `directory` (created if missing;
    files left there by a killed process are removed)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob("bottom-*"):
            stale.unlink(missing_ok=True)

    def allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        nbytes = 8 * math.prod(shape)
        if nbytes == 0:
            return np.empty(shape, dtype=np.float64)
        fd, path = tempfile.mkstemp(prefix="bottom-", dir=self.directory)
        try:
            os.unlink(path)
            os.ftruncate(fd, nbytes)  # sparse: disk blocks come with the first write
            mapped = mmap.mmap(fd, nbytes)  # shared, read-write
        finally:
            os.close(fd)
        return np.frombuffer(mapped, dtype=np.float64).reshape(shape)

    def settle(self, arrays: Iterable[np.ndarray]) -> None:
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        for a in arrays:
            mapped = _mapping(a)
            if mapped is not None:
                mapped.madvise(mmap.MADV_DONTNEED)
