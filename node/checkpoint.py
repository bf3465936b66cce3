"""Crash-safe checkpoints of a node: the ledger snapshot and the ledger's working state, the inner loop's
state, the error-feedback residual and a few counters, one file per checkpoint in the checkpoint directory.

File format (`ckpt-<round:08d>.dlc`), version 3 (byte by byte in docs/checkpoint-format.md):

    MAGIC (16 bytes) || body length L (u64 big-endian) || body || SHA-256 of everything before it
    body = header length H (u64 big-endian) || header (H bytes) || ledger || each array's raw bytes

`header` is msgpack (binary strings on) of a map: `meta` (plain values), `ledger` (the byte length of the
ledger part), `inner`, `feedback` and `outer` (lists of [name, dtype, shape], in the order their raw
little-endian C-order bytes follow the ledger). The ledger part and the `outer` arrays (the window
bottom and the ledger's working state) are `node.outer.resume`'s: the window's payloads stay in the blob
store, and a restore resumes without replaying the window. Nothing is a msgpack bin, so no part has a
size limit short of 2^64 bytes. Version 2 files (the ledger part one `LedgerSnapshot.to_bytes()`, payloads
inside, no `outer`: the restore decodes and replays) and
version 1 files (the same envelope around one msgpack map holding everything, each part one bin of at most
4 GiB − 1 bytes) are still read; a node built before a version skips its files (bad magic) and starts fresh.

Contract:
- Writing is atomic: `stage` writes a temp file (`.tmp-*`) in the same directory and fsyncs it; `commit`
  renames it over the final name and fsyncs the directory. A kill at any moment leaves either the old
  set of checkpoints or the old set plus the new one, never a half-written `ckpt-*` file; stale temp
  files are deleted when a `CheckpointDir` is opened.
- Writing streams: the file is written and hashed `_CHUNK` bytes at a time straight from the ledger's
  pieces (`LedgerSnapshot.to_pieces()`) and the arrays, never joined into one buffer. Reading hashes the
  ledger part as it streams by and returns it as a view of the memory-mapped file (a restore then holds
  only the snapshot's decoded copy, not the file's bytes too); each array is read into the buffer it is
  returned in and hashed there.
- `save` never raises for I/O errors (full disk, permissions): it logs one error line, removes its temp
  file and returns None, so training continues.
- `latest` returns the newest checkpoint that loads and verifies; every file it skips (truncated,
  corrupt, another run's or another peer's) is logged with the reason.
- The last `keep` checkpoints are kept; older ones are deleted after each successful commit.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
import mmap
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import numpy as np

from node.outer.outer_files import drop_pages

__all__ = ["Checkpoint", "CheckpointDir", "CheckpointError", "decode_checkpoint", "encode_checkpoint",
           "read_checkpoint", "write_checkpoint"]

log = logging.getLogger("node.checkpoint")

MAGIC = b"DILOCO-CKPT\x00v3\n\x00"  # written
MAGIC_V2 = b"DILOCO-CKPT\x00v2\n\x00"  # still read: no `outer` section
MAGIC_V1 = b"DILOCO-CKPT\x00v1\n\x00"  # still read
_NAME = re.compile(r"ckpt-(\d{8})\.dlc")
_TMP_PREFIX = ".tmp-"
_CHUNK = 8 << 20  # bytes written or read (and hashed) at a time
_HEADER_MAX = 64 << 20  # a longer header is a corrupt length field (a header names each array once)
_SECTIONS = ("inner", "feedback", "outer")
_SECTIONS_V2 = ("inner", "feedback")

Bytes = bytes | bytearray | memoryview


class CheckpointError(Exception):
    """A checkpoint file is truncated, corrupt, or not this node's."""


@dataclass(frozen=True)
class Checkpoint:
    """What a node needs to resume. `meta` holds plain values: `round`, `run_id`, `peer_id`, ...

    `ledger` is the ledger part: bytes, or the pieces whose concatenation it is, written one after the
    other without being joined. A loaded checkpoint holds bytes. `outer`: the ledger's arrays (window
    bottom, working state) that go with a version 3 ledger part (`node.outer.resume`); `version`: the
    file's (a version 1 or 2 ledger part is a `LedgerSnapshot` encoding, and `outer` is empty)."""

    meta: Mapping[str, Any]
    ledger: Bytes | Sequence[Bytes]
    inner: Mapping[str, np.ndarray] = field(default_factory=dict)
    feedback: Mapping[str, np.ndarray] = field(default_factory=dict)
    outer: Mapping[str, np.ndarray] = field(default_factory=dict)
    version: int = 3

    @property
    def round(self) -> int:
        return int(self.meta["round"])


def _byte_view(data: Bytes) -> memoryview:
    return memoryview(data).cast("B")


def _dtype_name(dtype: np.dtype) -> str:
    """`dtype.str` ("<f4"), or the name of a dtype that string does not give back (ml_dtypes' "bfloat16")."""
    return dtype.str if np.dtype(dtype.str) == dtype else dtype.name


def _arrays_out(arrays: Mapping[str, np.ndarray]) -> list[tuple[str, str, list[int], memoryview]]:
    """(name, dtype, shape, view of the raw little-endian bytes) per array, by name; copies only arrays
    that are not C-contiguous little-endian."""
    out = []
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        a = np.require(a, dtype=a.dtype.newbyteorder("<"), requirements="C")
        out.append((name, _dtype_name(a.dtype), list(a.shape), _byte_view(a.reshape(-1).view(np.uint8))))
    return out


def write_checkpoint(f: BinaryIO, ckpt: Checkpoint) -> None:
    """Write the version 3 file bytes of `ckpt` to `f`, `_CHUNK` bytes at a time (see the module
    docstring). Raises what `f.write` raises."""
    ledger = ckpt.ledger
    whole = isinstance(ledger, (bytes, bytearray, memoryview))
    pieces = [_byte_view(p) for p in ([ledger] if whole else ledger)]
    sections = {name: _arrays_out(getattr(ckpt, name)) for name in _SECTIONS}
    header = msgpack.packb(
        {"meta": dict(ckpt.meta), "ledger": sum(map(len, pieces)),
         **{name: [[n, dtype, shape] for n, dtype, shape, _ in arrays] for name, arrays in sections.items()}},
        use_bin_type=True,
    )
    blobs = pieces + [view for arrays in sections.values() for *_, view in arrays]
    body_length = 8 + len(header) + sum(map(len, blobs))
    digest = hashlib.sha256()
    head = MAGIC + body_length.to_bytes(8, "big") + len(header).to_bytes(8, "big") + header
    for blob in [_byte_view(head), *blobs]:
        for i in range(0, len(blob), _CHUNK):
            chunk = blob[i: i + _CHUNK]
            digest.update(chunk)
            f.write(chunk)
        drop_pages(blob)  # a payload mapped from its blob file: its pages need not stay resident
    f.write(digest.digest())


def read_checkpoint(f: BinaryIO, size: int) -> Checkpoint:
    """Parse and verify a checkpoint file of `size` bytes from `f` (version 3, 2 or 1); `CheckpointError`
    says what is wrong. Each array is read into the buffer it is returned in; the ledger part of a real
    file is hashed as it streams by and returned as a read-only view of the file, memory-mapped (the page
    cache's, not the process's: a restore decodes it without first holding a copy), else read."""
    head = f.read(len(MAGIC) + 8)
    if size < len(MAGIC) + 8 + 32 or len(head) < len(MAGIC) + 8 or head[: len(MAGIC)] not in (MAGIC, MAGIC_V2, MAGIC_V1):
        raise CheckpointError("not a checkpoint (bad magic or too short)")
    end = len(head) + int.from_bytes(head[len(MAGIC):], "big")
    if size != end + 32:
        raise CheckpointError(f"truncated or padded: {size} bytes, header says {end + 32}")
    if head.startswith(MAGIC_V1):
        return _decode_v1(head + _read(f, size - len(head)))
    digest = hashlib.sha256(head)
    header_length = int.from_bytes(_read(f, 8, digest), "big")
    if header_length > min(_HEADER_MAX, end - len(head) - 8):
        raise CheckpointError(f"corrupt: a header of {header_length} bytes")
    meta, ledger_length, sections = _parse_header(_read(f, header_length, digest),
                                                  _SECTIONS if head.startswith(MAGIC) else _SECTIONS_V2)
    sizes = ledger_length + sum(math.prod(shape) * dtype.itemsize for arrays in sections.values()
                                for _, dtype, shape in arrays)
    if len(head) + 8 + header_length + sizes != end:
        raise CheckpointError(f"corrupt: the header's sizes add up to {len(head) + 8 + header_length + sizes} "
                              f"bytes, the file to {end}")
    ledger = _mapped_part(f, ledger_length, digest) if _is_file(f) else _read(f, ledger_length, digest)
    loaded = {}
    for section, arrays in sections.items():
        loaded[section] = {}
        for name, dtype, shape in arrays:
            a = np.empty(shape, dtype)
            _read_into(f, _byte_view(a.reshape(-1).view(np.uint8)), digest)
            loaded[section][name] = a
    if _read(f, 32) != digest.digest():
        raise CheckpointError("checksum mismatch (corrupt file)")
    return Checkpoint(meta, ledger, loaded["inner"], loaded["feedback"], loaded.get("outer", {}),
                      3 if head.startswith(MAGIC) else 2)


def encode_checkpoint(ckpt: Checkpoint) -> bytes:
    """The file bytes of `ckpt` (`write_checkpoint` into memory: for small checkpoints and tests)."""
    out = io.BytesIO()
    write_checkpoint(out, ckpt)
    return out.getvalue()


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Parse and verify file bytes (`read_checkpoint` from memory); `CheckpointError` says what is wrong."""
    return read_checkpoint(io.BytesIO(data), len(data))


def _read(f: BinaryIO, n: int, digest: Any = None) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise CheckpointError(f"truncated: {n} bytes expected, {len(data)} read")
    if digest is not None:
        digest.update(data)
    return data


def _is_file(f: BinaryIO) -> bool:
    try:
        f.fileno()
    except (OSError, io.UnsupportedOperation, AttributeError):
        return False
    return True


def _mapped_part(f: BinaryIO, n: int, digest: Any) -> memoryview:
    """The next `n` bytes of the file `f`, hashed as they stream by (`_CHUNK` at a time) and returned as
    a read-only view of a memory map of the file (valid after `f` is closed or the file deleted)."""
    start = f.tell()
    buf = bytearray(min(_CHUNK, n))
    left = n
    while left:
        view = memoryview(buf)[: min(left, len(buf))]
        got = f.readinto(view)
        if not got:
            raise CheckpointError(f"truncated: {n} bytes expected, {n - left} read")
        digest.update(view[:got])
        left -= got
    if n == 0:
        return memoryview(b"")
    mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return memoryview(mapped)[start : start + n]


def _read_into(f: BinaryIO, view: memoryview, digest: Any) -> None:
    for i in range(0, len(view), _CHUNK):
        chunk = view[i: i + _CHUNK]
        got = 0
        while got < len(chunk):
            n = f.readinto(chunk[got:])
            if not n:
                raise CheckpointError("truncated: the file ends inside an array")
            got += n
        digest.update(chunk)


def _parse_header(raw: bytes, names: Sequence[str]) -> tuple[dict, int, dict[str, list[tuple[str, np.dtype, tuple[int, ...]]]]]:
    try:
        doc = msgpack.unpackb(raw, raw=False)
    except (msgpack.UnpackException, ValueError) as exc:
        raise CheckpointError(f"undecodable header: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"meta", "ledger", *names}:
        raise CheckpointError(f"header must be a map of meta, ledger, {', '.join(names)}")
    meta, ledger_length = doc["meta"], doc["ledger"]
    if not isinstance(meta, dict) or type(meta.get("round")) is not int:
        raise CheckpointError("meta must hold an int round")
    if type(ledger_length) is not int or ledger_length < 0:
        raise CheckpointError("ledger must be a byte count")
    sections = {}
    for section in names:
        items = doc[section]
        if not isinstance(items, list):
            raise CheckpointError(f"{section} must be a list")
        sections[section] = [_array_spec(item, section) for item in items]
        if len({name for name, _, _ in sections[section]}) != len(items):
            raise CheckpointError(f"{section} names an array twice")
    return meta, ledger_length, sections


def _array_spec(item: object, section: str) -> tuple[str, np.dtype, tuple[int, ...]]:
    if not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], str) or not isinstance(item[1], str):
        raise CheckpointError(f"{section}: an array is [name, dtype, shape]")
    name, dtype_name, shape = item
    try:
        dtype = np.dtype(dtype_name)
    except TypeError:
        raise CheckpointError(f"{section}[{name}]: unknown dtype {dtype_name!r}") from None
    if dtype.hasobject or dtype.itemsize == 0:
        raise CheckpointError(f"{section}[{name}]: dtype {dtype_name!r} is not raw numbers")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CheckpointError(f"{section}[{name}]: bad shape {shape!r}")
    return name, dtype, tuple(shape)


def _decode_v1(data: bytes) -> Checkpoint:
    """A version 1 file, already checked for magic and length: one msgpack map in the envelope."""
    end = len(data) - 32
    if hashlib.sha256(data[:end]).digest() != data[end:]:
        raise CheckpointError("checksum mismatch (corrupt file)")
    try:
        doc = msgpack.unpackb(data[len(MAGIC_V1) + 8: end], raw=False)
    except (msgpack.UnpackException, ValueError) as exc:
        raise CheckpointError(f"undecodable body: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"meta", "ledger", "inner", "feedback"}:
        raise CheckpointError("body must be a map of meta, ledger, inner, feedback")
    meta, ledger = doc["meta"], doc["ledger"]
    if not isinstance(meta, dict) or type(meta.get("round")) is not int or not isinstance(ledger, bytes):
        raise CheckpointError("meta must hold an int round and ledger must be bytes")
    return Checkpoint(meta, ledger, _arrays_in_v1(doc["inner"], "inner"), _arrays_in_v1(doc["feedback"], "feedback"),
                      version=1)


def _arrays_in_v1(doc: object, what: str) -> dict[str, np.ndarray]:
    if not isinstance(doc, dict):
        raise CheckpointError(f"{what} must be a map")
    out = {}
    for name, item in doc.items():
        try:
            dtype_str, shape, raw = item
            dtype = np.dtype(dtype_str)
            out[name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(shape)).copy()
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{what}[{name}]: {exc}") from None
    return out


class CheckpointDir:
    """The checkpoints of one node in `directory` (created if missing). One owner at a time."""

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3, expect: Mapping[str, str] | None = None):
        """`expect`: meta values a checkpoint must carry to be loaded (e.g. run_id, peer_id)."""
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.directory = Path(directory)
        self.keep = keep
        self.expect = dict(expect or {})
        self.last_error: str | None = None  # the last failed save (`save`), None after a success
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in self.directory.iterdir():
            if entry.name.startswith(_TMP_PREFIX):
                log.info("removing %s left by an interrupted checkpoint write", entry.name)
                entry.unlink(missing_ok=True)

    def paths(self) -> list[Path]:
        """Checkpoint files, newest (highest round) first."""
        found = [(int(m.group(1)), p) for p in self.directory.iterdir() if (m := _NAME.fullmatch(p.name))]
        return [p for _, p in sorted(found, reverse=True)]

    def stage(self, ckpt: Checkpoint) -> Path:
        """Stream `ckpt` into a fresh temp file, fsynced; nothing is visible to `latest` yet. Raises
        OSError; on any exception the temp file is removed."""
        tmp = self.directory / f"{_TMP_PREFIX}{ckpt.round:08d}-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with open(tmp, "xb") as f:
                write_checkpoint(f, ckpt)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def commit(self, tmp: Path, round_: int) -> Path:
        """Atomically publish a staged file as round `round_`'s checkpoint; prune old ones."""
        final = self.directory / f"ckpt-{round_:08d}.dlc"
        os.replace(tmp, final)
        self._fsync_dir()
        for old in self.paths()[self.keep:]:
            old.unlink(missing_ok=True)
        return final

    def save(self, ckpt: Checkpoint) -> Path | None:
        """`commit(stage(ckpt))`; on an I/O error logs it, keeps it in `last_error` (None after a success)
        and returns None (training goes on; the previous checkpoints are untouched)."""
        try:
            path = self.commit(self.stage(ckpt), ckpt.round)
        except OSError as exc:
            self.last_error = f"checkpoint of round {ckpt.round} not written: {exc}"
            log.error("%s", self.last_error)
            return None
        self.last_error = None
        return path

    def latest(self) -> Checkpoint | None:
        """The newest valid checkpoint, or None. Skipped files are logged with their reason."""
        for path in self.paths():
            try:
                with open(path, "rb") as f:
                    ckpt = read_checkpoint(f, os.fstat(f.fileno()).st_size)
                for key, value in self.expect.items():
                    if ckpt.meta.get(key) != value:
                        raise CheckpointError(f"{key} is {ckpt.meta.get(key)!r}, expected {value!r}")
            except (OSError, CheckpointError) as exc:
                log.warning("skipping checkpoint %s: %s", path.name, exc)
                continue
            return ckpt
        return None

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
