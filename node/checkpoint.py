"""Crash-safe checkpoints of a node: the ledger snapshot, the inner loop's state, the error-feedback
residual and a few counters, one file per checkpoint in the checkpoint directory.

File format (`ckpt-<round:08d>.dlc`):

    MAGIC (16 bytes) || body length (u64 big-endian) || body || SHA-256 of everything before it

`body` is msgpack (binary strings on) of a map: `meta` (plain values), `ledger` (the canonical
`LedgerSnapshot.to_bytes()`), `inner` and `feedback` (name -> [dtype, shape, raw little-endian bytes]).

Contract:
- Writing is atomic: `stage` writes a temp file (`.tmp-*`) in the same directory and fsyncs it; `commit`
  renames it over the final name and fsyncs the directory. A kill at any moment leaves either the old
  set of checkpoints or the old set plus the new one, never a half-written `ckpt-*` file; stale temp
  files are deleted when a `CheckpointDir` is opened.
- `save` never raises for I/O errors (full disk, permissions): it logs one error line, removes its temp
  file and returns None, so training continues.
- `latest` returns the newest checkpoint that loads and verifies; every file it skips (truncated,
  corrupt, another run's or another peer's) is logged with the reason.
- The last `keep` checkpoints are kept; older ones are deleted after each successful commit.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

__all__ = ["Checkpoint", "CheckpointDir", "CheckpointError", "decode_checkpoint", "encode_checkpoint"]

log = logging.getLogger("node.checkpoint")

MAGIC = b"DILOCO-CKPT\x00v1\n\x00"
_NAME = re.compile(r"ckpt-(\d{8})\.dlc")
_TMP_PREFIX = ".tmp-"


class CheckpointError(Exception):
    """A checkpoint file is truncated, corrupt, or not this node's."""


@dataclass(frozen=True)
class Checkpoint:
    """What a node needs to resume. `meta` holds plain values: `round`, `run_id`, `peer_id`, ..."""

    meta: Mapping[str, Any]
    ledger: bytes
    inner: Mapping[str, np.ndarray] = field(default_factory=dict)
    feedback: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def round(self) -> int:
        return int(self.meta["round"])


def _arrays_out(arrays: Mapping[str, np.ndarray]) -> dict[str, list]:
    out = {}
    for name in sorted(arrays):
        a = np.asarray(arrays[name])
        a = np.require(a, dtype=a.dtype.newbyteorder("<"), requirements="C")  # keeps 0-d arrays 0-d
        out[name] = [a.dtype.str, list(a.shape), a.tobytes()]
    return out


def _arrays_in(doc: object, what: str) -> dict[str, np.ndarray]:
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


def encode_checkpoint(ckpt: Checkpoint) -> bytes:
    """The file bytes of `ckpt` (see the module docstring)."""
    body = msgpack.packb(
        {"meta": dict(ckpt.meta), "ledger": ckpt.ledger, "inner": _arrays_out(ckpt.inner),
         "feedback": _arrays_out(ckpt.feedback)},
        use_bin_type=True,
    )
    head = MAGIC + len(body).to_bytes(8, "big")
    return head + body + hashlib.sha256(head + body).digest()


def decode_checkpoint(data: bytes) -> Checkpoint:
    """Parse and verify file bytes; `CheckpointError` says what is wrong."""
    if len(data) < len(MAGIC) + 8 + 32 or not data.startswith(MAGIC):
        raise CheckpointError("not a checkpoint (bad magic or too short)")
    size = int.from_bytes(data[len(MAGIC): len(MAGIC) + 8], "big")
    end = len(MAGIC) + 8 + size
    if len(data) != end + 32:
        raise CheckpointError(f"truncated or padded: {len(data)} bytes, header says {end + 32}")
    if hashlib.sha256(data[:end]).digest() != data[end:]:
        raise CheckpointError("checksum mismatch (corrupt file)")
    try:
        doc = msgpack.unpackb(data[len(MAGIC) + 8: end], raw=False)
    except (msgpack.UnpackException, ValueError) as exc:
        raise CheckpointError(f"undecodable body: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"meta", "ledger", "inner", "feedback"}:
        raise CheckpointError("body must be a map of meta, ledger, inner, feedback")
    meta, ledger = doc["meta"], doc["ledger"]
    if not isinstance(meta, dict) or type(meta.get("round")) is not int or not isinstance(ledger, bytes):
        raise CheckpointError("meta must hold an int round and ledger must be bytes")
    return Checkpoint(meta, ledger, _arrays_in(doc["inner"], "inner"), _arrays_in(doc["feedback"], "feedback"))


class CheckpointDir:
    """The checkpoints of one node in `directory` (created if missing). One owner at a time."""

    def __init__(self, directory: str | os.PathLike[str], *, keep: int = 3, expect: Mapping[str, str] | None = None):
        """`expect`: meta values a checkpoint must carry to be loaded (e.g. run_id, peer_id)."""
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.directory = Path(directory)
        self.keep = keep
        self.expect = dict(expect or {})
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
        """Write `ckpt` to a fresh temp file, fsynced; nothing is visible to `latest` yet. Raises OSError."""
        data = encode_checkpoint(ckpt)
        tmp = self.directory / f"{_TMP_PREFIX}{ckpt.round:08d}-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
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
        """`commit(stage(ckpt))`; on an I/O error logs it and returns None (training goes on)."""
        try:
            return self.commit(self.stage(ckpt), ckpt.round)
        except OSError as exc:
            log.error("checkpoint of round %d not written: %s", ckpt.round, exc)
            return None

    def latest(self) -> Checkpoint | None:
        """The newest valid checkpoint, or None. Skipped files are logged with their reason."""
        for path in self.paths():
            try:
                ckpt = decode_checkpoint(path.read_bytes())
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
