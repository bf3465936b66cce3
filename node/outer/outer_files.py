"""Memory-mapped files of the outer state: payload blobs (`map_blob`) and the ledger's window bottom
(`MappedBottom`, a `protocol.ledger.storage.BottomStore`), with `drop_pages` to let a mapping's resident
pages go after a pass (they count in the process's RSS until then).

A blob is mapped read-only; the blob store may delete its file while it is mapped. Each bottom array is a shared mapping of its own file in the node's data directory, unlinked as soon as it is
mapped: the kernel keeps the file while the mapping lives and frees its disk space when the ledger drops
the array, so a crash leaves nothing behind. After each of the ledger's passes over the bottom (once per
slot that leaves the window) `settle` tells the kernel the pages may go (`MADV_DONTNEED`): written-back
file pages, not the process's memory, until the next pass reads them again. The ledger settles the
payloads it has read the same way (after a slot's sum is computed, a fold, a replay). Thread-safety: `allocate` and
`settle` are called by the ledger's one user (the replica's worker thread).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import logging
import math
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from protocol.ledger import STATE_DTYPE, LedgerSnapshot, Payload, PayloadDeltas, SnapshotEntry

__all__ = ["MappedBlob", "MappedBottom", "drop_pages", "map_blob", "payload_blob", "payloads_to_blobs", "remove_old_blobs",
           "return_freed_memory"]

log = logging.getLogger(__name__)

class BlobPut(Protocol):
    """What `payloads_to_blobs` needs of a blob store (`p2p.BlobStore`)."""

    def put(self, data: bytes | memoryview) -> str: ...

    def path(self, h: str) -> Path: ...


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 1 << 20  # allocations at least this big are mapped on their own, and unmapped when freed


def return_freed_memory() -> bool:
    """Make freed model-sized buffers leave the process (glibc only; False elsewhere, a no-op).

    The outer work allocates and frees temporaries of a tensor's size in several threads (a slot's sum,
    a decoded tensor). glibc serves allocations above its mmap threshold with their own mapping, but
    raises that threshold (up to 32 MiB) each time such a block is freed, after which tensor-sized blocks
    come from the threads' heaps and stay there when freed: ~10 bytes per parameter of resident memory
    nobody uses (scale benchmark, 1e7 parameters). A fixed threshold keeps every block of a MiB or more
    mapped. Call it once, at start, before any large allocation."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


class MappedBlob(mmap.mmap):
    """A blob file mapped read-only by `map_blob`; `blob` is its name in the blob store (the file's name,
    64 hex digits of its SHA-256), None for a file named otherwise."""

    blob: str | None = None


def map_blob(path: Path) -> memoryview:
    """A read-only memory map of a stored blob: the ledger keeps an update's payload this way, so it stays
    on disk (the page cache's) instead of in the process. The file may be deleted while mapped."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return memoryview(b"")
        mapped = MappedBlob(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapped.blob = path.name if _is_blob_name(path.name) else None
    return memoryview(mapped)


def payload_blob(payload: Payload) -> str | None:
    """The blob-store name of a payload mapped from its blob file (`map_blob`), else None (bytes in memory)."""
    data = payload.data
    return data.obj.blob if isinstance(data, memoryview) and isinstance(data.obj, MappedBlob) else None


def _is_blob_name(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def remove_old_blobs(directory: Path, keep: Iterable[str] = ()) -> tuple[int, int]:
    """Delete the blobs a previous process of this node left in its blob store `directory` (payloads of
    updates long final, snapshots it served), but those in `keep` (the window's payloads, which the
    checkpoint a restart resumes from refers to): anything newer comes from its peers. Returns (blobs,
    bytes) removed. Only names the blob store gives its files (64 hex digits, or a `.part`) are touched."""
    removed = freed = 0
    kept = frozenset(keep)
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.is_file() and (_is_blob_name(entry.name) and entry.name not in kept
                                    or entry.name.endswith(".part")):
                freed += entry.stat().st_size
                entry.unlink(missing_ok=True)
                removed += 1
    return removed, freed


SCRATCH_PREFIX = "diloco-node-"
STALE_SCRATCH_S = 600.0  # a scratch directory unchanged this long, of a process that is gone, is left over


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """The data directory of a node without `--checkpoint-dir` (blobs, the window bottom's files): a
    temporary directory named after this process, `diloco-node-<pid>-*`, removed when the node stops. The
    ones that processes killed before they could remove theirs left behind (their pid no longer runs, and
    nothing in them changed for `STALE_SCRATCH_S`) are removed first, so that a node killed again and again
    does not fill the disk with blobs."""
    root = Path(tempfile.gettempdir())
    for entry in root.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = entry.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        try:
            idle_s = time.time() - entry.stat().st_mtime
        except OSError:
            continue
        if pid.isdigit() and entry.is_dir() and idle_s > STALE_SCRATCH_S and not _running(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        pass
    return True


def payloads_to_blobs(snap: LedgerSnapshot, store: BlobPut) -> tuple[LedgerSnapshot, list[tuple[int, str]]]:
    """`snap` with every entry's payload moved into the blob store and memory-mapped from there, and the
    (target slot, blob) pairs for the node's blob clean-up. A checkpoint's snapshot holds the window's
    payloads in memory (int4: ~0.53 B/param per update); after this, the ledger loaded from it keeps them
    on disk like any other, and the checkpoint's bytes can go. The norms checked while the snapshot was
    decoded carry over (nothing is decoded again)."""
    entries, blobs = [], []
    for e in snap.entries:
        if e.payload is None:
            entries.append(e)
            continue
        h = store.put(e.payload.data)
        mapped = Payload(e.payload.codec, map_blob(store.path(h)))
        norms = getattr(e.deltas, "norms", None)
        deltas = PayloadDeltas(mapped, snap.shapes) if norms is None else PayloadDeltas.measured(mapped, snap.shapes, norms)
        entries.append(SnapshotEntry(e.meta, e.slot, deltas, mapped))
        blobs.append((e.meta.target_slot, h))
    return dataclasses.replace(snap, entries=tuple(entries)), blobs


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
        self.disk_error: str | None = None  # the last allocation that could not be a file (a full disk)
        for stale in self.directory.glob("bottom-*"):
            stale.unlink(missing_ok=True)

    def allocate(self, shape: tuple[int, ...]) -> np.ndarray:
        """A mapped file's array, its blocks reserved now: a full disk is an `OSError` here, never a SIGBUS
        at the first write into a sparse page. On a full disk the array is an in-memory one instead (logged
        once until a file fits again)."""
        nbytes = STATE_DTYPE.itemsize * math.prod(shape)
        if nbytes == 0:
            return np.empty(shape, dtype=STATE_DTYPE)
        try:
            fd, path = tempfile.mkstemp(prefix="bottom-", dir=self.directory)
        except OSError as exc:
            return self._in_memory(shape, exc)
        try:
            os.unlink(path)
            os.posix_fallocate(fd, 0, nbytes)
            mapped = mmap.mmap(fd, nbytes)  # shared, read-write
        except OSError as exc:
            return self._in_memory(shape, exc)
        finally:
            os.close(fd)
        if self.disk_error is not None:
            log.warning("the window bottom's arrays are on disk again")
            self.disk_error = None
        return np.frombuffer(mapped, dtype=STATE_DTYPE).reshape(shape)

    def _in_memory(self, shape: tuple[int, ...], exc: OSError) -> np.ndarray:
        if self.disk_error is None:
            log.error("the window bottom's arrays are kept in memory: %s", exc)
        self.disk_error = f"{type(exc).__name__}: {exc}"
        return np.empty(shape, dtype=STATE_DTYPE)

    def settle(self, arrays: Iterable[np.ndarray | memoryview]) -> None:
        for a in arrays:
            drop_pages(a)
