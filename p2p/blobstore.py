"""Content-addressed blob storage on local disk: a blob's name is the hex SHA-256 of its bytes.

Contract:
- A blob is visible (`has`, `path`, served over HTTP) only after its bytes were hashed and matched
  the name; partial downloads live as `<hex>.part` files and are never served.
- `BlobWriter` receives a body chunk by chunk, hashing as it writes, so a body is never held whole
  in memory twice. Its methods are synchronous and may run in a worker thread (hashlib and file
  writes release the GIL); one writer is used by one task at a time.
- All methods here are blocking file I/O; async callers run the slow ones through
  `trio.to_thread.run_sync`.
- Removal respects readers: a task that will read blobs by path (a state download between its fetch and
  its load, a checkpoint that refers to them) `keep`s them first. A `remove` of a kept blob hides it at
  once (`has` is False, it is no longer served) and deletes the file when the last keeper `release`s it,
  unless the blob was stored again meanwhile. So a path obtained while a blob is kept stays readable
  until the release, whoever removes the blob (the blob clean-up, a failed download).
- A full disk does not stop the store (`spill_dir`, `spill_limit`): when a write into the directory fails
  (ENOSPC, a quota, a file-size limit: any `OSError`), that blob and every later one go to the spill
  directory (by default in `/dev/shm`: memory) while they fit in `spill_limit` bytes; `disk_error` says
  why. `path` gives the spilled file, so readers, mappings and the HTTP plane do not see the difference.
  `unspill` moves spilled blobs back into the directory once it can be written again (moved blobs keep
  their open files and mappings: the spilled file is unlinked, not overwritten). A blob that fits
  neither raises the `OSError`, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError

_HEX64 = re.compile(r"[0-9a-f]{64}")


def blob_hex(data: bytes | memoryview) -> str:
    """The name of `data` in the store: lower-case hex SHA-256."""
    return hashlib.sha256(data).hexdigest()


def check_hex(h: str) -> str:
    """Return `h` if it is a well-formed blob name, else raise LocalProtocolError."""
    if not _HEX64.fullmatch(h):
        raise LocalProtocolError(f"not a blob name (64 lower-case hex digits): {h!r}")
    return h


def default_spill_dir(directory: str | os.PathLike[str]) -> Path:
    """Where a store in `directory` spills blobs when its disk is full: a directory of its own in `/dev/shm`
    (memory) when that is writable, else in the system's temporary directory; the same for the same store, so a
    node restarted on a still-full disk finds the blobs it spilled."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    tag = hashlib.sha256(str(Path(directory).resolve()).encode()).hexdigest()[:16]
    return base / f"diloco-spill-{tag}"


class BlobStore:
    """A directory of verified blobs named by their SHA-256 (and a spill directory for a full disk)."""

    def __init__(self, directory: str | os.PathLike[str], spill_dir: str | os.PathLike[str] | None = None,
                 spill_limit: int = 0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.spill_dir = Path(spill_dir) if spill_dir is not None and spill_limit > 0 else None
        self.spill_limit = spill_limit if self.spill_dir is not None else 0
        self.disk_error: str | None = None  # the last failed write into `directory`, until `unspill` empties the spill
        self._lock = threading.Lock()  # guards the fields below and the renames and deletions of blob files
        self._sizes: dict[str, int] = {}
        self._spilled: set[str] = set()  # blobs whose file is in the spill directory
        self._keepers: Counter[str] = Counter()  # blob → how many `keep` it (stored or not)
        self._doomed: set[str] = set()  # removed while kept: hidden, deleted at the last release
        for entry in self.directory.iterdir():
            if _HEX64.fullmatch(entry.name):
                self._sizes[entry.name] = entry.stat().st_size
            elif entry.name.endswith(".part"):
                entry.unlink()  # left by a crash mid-download; never trusted
        if self.spill_dir is not None and self.spill_dir.is_dir():
            for entry in self.spill_dir.iterdir():  # spilled by this store before a restart
                if _HEX64.fullmatch(entry.name) and entry.name not in self._sizes:
                    self._sizes[entry.name] = entry.stat().st_size
                    self._spilled.add(entry.name)
                elif entry.name.endswith(".part") or _HEX64.fullmatch(entry.name):
                    entry.unlink()
            if self._spilled:
                self.disk_error = "blobs left in the spill directory by an earlier run"

    @property
    def spilled_bytes(self) -> int:
        """Bytes of the blobs held in the spill directory."""
        with self._lock:
            return sum(self._sizes[h] for h in self._spilled)

    def _location(self, h: str) -> Path:
        return self.spill_dir if h in self._spilled else self.directory  # type: ignore[return-value]

    def directory_for(self, size: int) -> Path:
        """Where a new blob (or another file of the node's, e.g. a downloaded state) of `size` bytes is written:
        the directory, or the spill one while the disk is full and the spill has room."""
        return self.spill_dir if self.disk_error is not None and self._spill_room(size) else self.directory

    def _spill_room(self, size: int) -> bool:
        return self.spill_dir is not None and self.spilled_bytes + size <= self.spill_limit

    def note_disk_error(self, exc: OSError) -> None:
        """A write into the directory failed: later blobs go to the spill directory while it has room."""
        self.disk_error = f"{type(exc).__name__}: {exc}"

    def has(self, h: str) -> bool:
        with self._lock:
            return h in self._sizes

    def size(self, h: str) -> int:
        """Size in bytes of a stored blob; KeyError if absent."""
        with self._lock:
            return self._sizes[h]

    def path(self, h: str) -> Path:
        """Path of a stored blob, or of one removed while kept (its file stays until the release); KeyError
        if neither. The file is complete and verified."""
        with self._lock:
            if h not in self._sizes and h not in self._doomed:
                raise KeyError(h)
            return self._location(h) / h

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._sizes)

    def read(self, h: str) -> bytes:
        """The whole blob (for small blobs and tests; large consumers should map or stream the path)."""
        return self.path(h).read_bytes()

    def put(self, data: bytes | memoryview) -> str:
        """Store `data` (hashed here) and return its name. Idempotent."""
        h = blob_hex(data)
        if self.has(h):
            return h
        first = self.directory_for(len(data))
        try:
            self._put_once(h, data)
        except OSError as exc:  # the disk is full: spill it, when it fits (and was not tried already)
            if first != self.directory or not self._spill_room(len(data)):
                raise
            self.note_disk_error(exc)
            self._put_once(h, data)
        return h

    def _put_once(self, h: str, data: bytes | memoryview) -> None:
        writer = self.open_writer(h, len(data))
        try:
            writer.write(data)
            writer.commit()
        finally:
            writer.close()

    def put_file(self, source: str | os.PathLike[str], chunk_bytes: int = 4 << 20) -> str:
        """Copy a file into the store (hashing the bytes as they are copied, so the name always
        matches the stored content) and return its name. Blocking: run it in a worker thread."""
        digest = hashlib.sha256()
        part = self.directory / f"incoming.{threading.get_ident():x}.{os.getpid()}.part"
        size = 0
        try:
            with open(source, "rb") as src, open(part, "wb") as dst:
                while chunk := src.read(chunk_bytes):
                    digest.update(chunk)
                    dst.write(chunk)
                    size += len(chunk)
            h = digest.hexdigest()
            if not self.has(h):
                self._publish(h, part, size)
            return h
        finally:
            part.unlink(missing_ok=True)

    def open_writer(self, h: str, size: int) -> BlobWriter:
        """A writer for blob `h` of exactly `size` bytes. Call `commit()` to publish, `close()` always."""
        check_hex(h)
        if size < 0:
            raise LocalProtocolError(f"negative blob size {size}")
        return BlobWriter(self, h, size)

    def open_piece_writer(self, h: str, size: int) -> PieceWriter:
        """A writer for blob `h` whose byte ranges arrive in any order (`PieceWriter.section`)."""
        check_hex(h)
        if size < 0:
            raise LocalProtocolError(f"negative blob size {size}")
        return PieceWriter(self, h, size)

    def _publish(self, h: str, part: Path, size: int) -> None:
        with self._lock:
            os.replace(part, part.parent / h)
            self._sizes[h] = size
            self._doomed.discard(h)
            if part.parent == self.spill_dir and part.parent != self.directory:
                self._spilled.add(h)
            else:
                self._spilled.discard(h)

    def unspill(self) -> int:
        """Move spilled blobs back into the directory (blocking: a worker thread); stops at the first write
        that fails (the disk is still full). Returns how many moved; `disk_error` is cleared once none is left."""
        moved = 0
        with self._lock:
            names = sorted(self._spilled)
        for h in names:
            with self._lock:
                if h not in self._spilled or self._keepers[h]:
                    continue  # removed meanwhile, or a reader holds its spill path
            part = self.directory / f"{h}.unspill.part"
            try:
                with open(self.spill_dir / h, "rb") as src, open(part, "wb") as dst:  # type: ignore[operator]
                    while chunk := src.read(4 << 20):
                        dst.write(chunk)
                    dst.flush()
                    os.fsync(dst.fileno())
            except OSError as exc:
                part.unlink(missing_ok=True)
                self.note_disk_error(exc)
                return moved
            with self._lock:
                if h in self._spilled:
                    os.replace(part, self.directory / h)
                    self._spilled.discard(h)
                    (self.spill_dir / h).unlink(missing_ok=True)  # type: ignore[operator]
                    moved += 1
                else:
                    part.unlink(missing_ok=True)
        with self._lock:
            if not self._spilled:
                self.disk_error = None
                if self.spill_dir is not None:
                    with contextlib.suppress(OSError):  # when empty (a state download's files keep it)
                        self.spill_dir.rmdir()
        return moved

    def remove(self, h: str) -> None:
        """Forget and delete a blob (e.g. an old snapshot). Absent blobs are ignored; a kept one is hidden
        now and deleted at its last release (module docstring)."""
        with self._lock:
            if h not in self._sizes:
                return
            location = self._location(h)
            del self._sizes[h]
            if self._keepers[h]:
                self._doomed.add(h)
            else:
                (location / h).unlink(missing_ok=True)
                self._spilled.discard(h)

    def keep(self, names: Iterable[str]) -> None:
        """Keep the files of blobs `names` until `release` (module docstring); names not stored yet may be
        kept too (a blob being fetched). Each `keep` needs its own `release`."""
        with self._lock:
            self._keepers.update(names)

    def release(self, names: Iterable[str]) -> None:
        """End one `keep` of `names`; a blob removed meanwhile, and kept by nobody else now, is deleted."""
        with self._lock:
            for h in names:
                self._keepers[h] -= 1
                if self._keepers[h] <= 0:
                    del self._keepers[h]
                    if h in self._doomed:
                        self._doomed.discard(h)
                        (self._location(h) / h).unlink(missing_ok=True)
                        self._spilled.discard(h)

    @contextmanager
    def kept(self, names: Iterable[str]) -> Iterator[None]:
        """`keep` `names` while the block runs."""
        names = list(names)
        self.keep(names)
        try:
            yield
        finally:
            self.release(names)


class BlobWriter:
    """Streams one blob to `<hex>.part` while hashing it; `commit()` verifies and renames.

    Raises RemoteProtocolError(OVERSIZED) when more than `size` bytes are written and
    RemoteProtocolError(TRUNCATED / HASH_MISMATCH) at commit when the bytes are short or wrong.
    """

    _MODE = "wb"

    def __init__(self, store: BlobStore, h: str, size: int) -> None:
        self._store = store
        self.name = h
        self.size = size
        self.written = 0
        self._hash = hashlib.sha256()
        # a unique part file per writer: two concurrent writers of one blob never share a file
        directory = store.directory_for(size)
        if directory != store.directory:
            directory.mkdir(parents=True, exist_ok=True)
        self._part = directory / f"{h}.{id(self):x}.part"
        self._done = False
        try:
            self._file = open(self._part, self._MODE)  # noqa: SIM115 - closed in close()
        except OSError as exc:
            self._disk_error(exc)
            raise

    def _disk_error(self, exc: OSError) -> None:
        if self._part.parent == self._store.directory:
            self._store.note_disk_error(exc)

    def write(self, chunk: bytes | memoryview) -> None:
        if self.written + len(chunk) > self.size:
            raise RemoteProtocolError(
                Reason.OVERSIZED, f"blob {self.name[:12]} longer than the announced {self.size} bytes"
            )
        self._hash.update(chunk)
        try:
            self._file.write(chunk)
        except OSError as exc:
            self._disk_error(exc)
            raise
        self.written += len(chunk)

    def commit(self) -> None:
        if self.written != self.size:
            raise RemoteProtocolError(
                Reason.TRUNCATED, f"blob {self.name[:12]}: {self.written} of {self.size} bytes"
            )
        if self._hash.hexdigest() != self.name:
            raise RemoteProtocolError(Reason.HASH_MISMATCH, f"blob {self.name[:12]}: sha256 differs")
        try:
            self._file.close()  # a full disk may only show here, when the buffer is written
        except OSError as exc:
            self._disk_error(exc)
            raise
        self._store._publish(self.name, self._part, self.size)
        self._done = True

    def close(self) -> None:
        """Release the file; an uncommitted part file is deleted."""
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:  # the write already failed and was reported; the part file goes below
                pass
        if not self._done:
            self._part.unlink(missing_ok=True)


class PieceWriter(BlobWriter):
    """Writes one blob's byte ranges into its part file, in any order and from several threads at once
    (`section(start, end).write(chunk)`, each an `os.pwrite` at its own offset); `commit()` reads the file back,
    hashes it, verifies and publishes. The ranges must not overlap; `commit` raises TRUNCATED unless they
    cover the blob, HASH_MISMATCH when its bytes are wrong (which range was wrong cannot be known: the
    caller fetches again from one holder to find out)."""

    _MODE = "w+b"
    HASH_READ = 8 << 20

    def __init__(self, store: BlobStore, h: str, size: int) -> None:
        super().__init__(store, h, size)
        self._sections: list[Section] = []

    def section(self, start: int, end: int) -> Section:
        """Where the bytes [start, end) go; `Section.at` is how far they have been written."""
        if not 0 <= start <= end <= self.size:
            raise LocalProtocolError(f"range {start}-{end} outside blob of {self.size} bytes")
        section = Section(self, start, end)
        self._sections.append(section)
        return section

    def write(self, chunk: bytes | memoryview) -> None:
        raise TypeError("a PieceWriter is written through its sections")

    def _write_at(self, offset: int, chunk: bytes | memoryview) -> None:
        fd = self._file.fileno()
        with memoryview(chunk) as view:
            done = 0
            try:
                while done < len(view):
                    done += os.pwrite(fd, view[done:], offset + done)
            except OSError as exc:
                self._disk_error(exc)
                raise

    def commit(self) -> None:
        self.written = sum(s.at - s.start for s in self._sections)
        if self.written != self.size:
            raise RemoteProtocolError(Reason.TRUNCATED, f"blob {self.name[:12]}: {self.written} of {self.size} bytes")
        digest = hashlib.sha256()
        fd = self._file.fileno()
        for offset in range(0, self.size, self.HASH_READ):
            digest.update(os.pread(fd, min(self.HASH_READ, self.size - offset), offset))
        if digest.hexdigest() != self.name:
            raise RemoteProtocolError(Reason.HASH_MISMATCH, f"blob {self.name[:12]}: sha256 differs")
        try:
            self._file.close()
        except OSError as exc:
            self._disk_error(exc)
            raise
        self._store._publish(self.name, self._part, self.size)
        self._done = True


class Section:
    """The bytes [start, end) of a `PieceWriter`'s blob, written in order from `start`; `at` is the next offset."""

    def __init__(self, writer: PieceWriter, start: int, end: int) -> None:
        self.writer, self.start, self.end, self.at = writer, start, end, start

    @property
    def size(self) -> int:
        return self.end - self.at

    def write(self, chunk: bytes | memoryview) -> None:
        if self.at + len(chunk) > self.end:
            raise RemoteProtocolError(Reason.OVERSIZED, f"blob {self.writer.name[:12]}: more than bytes "
                                      f"{self.start}-{self.end} of its range")
        self.writer._write_at(self.at, chunk)
        self.at += len(chunk)
