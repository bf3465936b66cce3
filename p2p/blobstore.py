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
"""

from __future__ import annotations

import hashlib
import os
import re
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


class BlobStore:
    """A directory of verified blobs named by their SHA-256."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # guards the fields below and the renames and deletions of blob files
        self._sizes: dict[str, int] = {}
        self._keepers: Counter[str] = Counter()  # blob → how many `keep` it (stored or not)
        self._doomed: set[str] = set()  # removed while kept: hidden, deleted at the last release
        for entry in self.directory.iterdir():
            if _HEX64.fullmatch(entry.name):
                self._sizes[entry.name] = entry.stat().st_size
            elif entry.name.endswith(".part"):
                entry.unlink()  # left by a crash mid-download; never trusted

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
        return self.directory / h

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
        writer = self.open_writer(h, len(data))
        try:
            writer.write(data)
            writer.commit()
        finally:
            writer.close()
        return h

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

    def _publish(self, h: str, part: Path, size: int) -> None:
        with self._lock:
            os.replace(part, self.directory / h)
            self._sizes[h] = size
            self._doomed.discard(h)

    def remove(self, h: str) -> None:
        """Forget and delete a blob (e.g. an old snapshot). Absent blobs are ignored; a kept one is hidden
        now and deleted at its last release (module docstring)."""
        with self._lock:
            if self._sizes.pop(h, None) is None:
                return
            if self._keepers[h]:
                self._doomed.add(h)
            else:
                (self.directory / h).unlink(missing_ok=True)

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
                        (self.directory / h).unlink(missing_ok=True)

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

    def __init__(self, store: BlobStore, h: str, size: int) -> None:
        self._store = store
        self.name = h
        self.size = size
        self.written = 0
        self._hash = hashlib.sha256()
        # a unique part file per writer: two concurrent writers of one blob never share a file
        self._part = store.directory / f"{h}.{id(self):x}.part"
        self._file = open(self._part, "wb")  # noqa: SIM115 - closed in close()
        self._done = False

    def write(self, chunk: bytes | memoryview) -> None:
        if self.written + len(chunk) > self.size:
            raise RemoteProtocolError(
                Reason.OVERSIZED, f"blob {self.name[:12]} longer than the announced {self.size} bytes"
            )
        self._hash.update(chunk)
        self._file.write(chunk)
        self.written += len(chunk)

    def commit(self) -> None:
        if self.written != self.size:
            raise RemoteProtocolError(
                Reason.TRUNCATED, f"blob {self.name[:12]}: {self.written} of {self.size} bytes"
            )
        if self._hash.hexdigest() != self.name:
            raise RemoteProtocolError(Reason.HASH_MISMATCH, f"blob {self.name[:12]}: sha256 differs")
        self._file.close()
        self._store._publish(self.name, self._part, self.size)
        self._done = True

    def close(self) -> None:
        """Release the file; an uncommitted part file is deleted."""
        if not self._file.closed:
            self._file.close()
        if not self._done:
            self._part.unlink(missing_ok=True)
