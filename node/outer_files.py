"""Memory-mapped files of the outer state: payload blobs (`map_blob`) and the ledger's window bottom
(`MappedBottom`, a `protocol.ledger.storage.BottomStore`), with `drop_pages` to let a mapping's resident
pages go after a pass (they count in the process's RSS until then).

A blob is mapped read-only; the blob store may delete its file while it is mapped. Each bottom array is a shared mapping of its own file in the node's data directory, unlinked as soon as it is
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

__all__ = ["MappedBottom", "drop_pages", "map_blob"]


def map_blob(path: Path) -> memoryview:
    """A read-only memory map of a stored blob: the ledger keeps an update's payload this way, so it stays
    on disk (the page cache's) instead of in the process. The file may be deleted while mapped."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return memoryview(b"")
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def drop_pages(data: object) -> None:
    """Let the kernel drop the resident pages of the mmap under `data` (an array or a memoryview made
    here, or a view of one); the next access reads them again. No effect on anything else."""
    while data is not None and not isinstance(data, mmap.mmap):
        data = data.obj if isinstance(data, memoryview) else getattr(data, "base", None)
    if data is not None and hasattr(mmap, "MADV_DONTNEED"):
        data.madvise(mmap.MADV_DONTNEED)


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
        for a in arrays:
            drop_pages(a)
