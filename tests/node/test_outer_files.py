"""Tier (a): a ledger whose window bottom lives in memory-mapped files (`node.outer.outer_files.MappedBottom`)
holds the same bits as one in memory, lets the pages go between passes, and leaves no file behind."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from node.outer.outer_files import MappedBottom
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot, UpdateMeta

SHAPES = {"emb": (64, 33), "w": (70_001,), "empty": (0,)}
CONFIG = LedgerConfig(window=2, embeddings=frozenset({"emb"}))


def resident_bytes(a: np.ndarray) -> int:
    """Bytes of `a`'s pages resident in this process (from /proc/self/smaps, the mapping that holds it)."""
    start = a.__array_interface__["data"][0]
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= start < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("mapping not found")


def run(ledger: Ledger) -> Ledger:
    rng = np.random.default_rng(0)
    for r in range(1, 7):  # four slots leave the window of 2
        for who in ("a", "b"):
            tag = f"{who}{r}"
            meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), who, r - 1, r - 1, 64, 4)
            ledger.add(meta, {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()})
        ledger.close_slot()
    return ledger


def test_a_mapped_bottom_holds_the_same_bits_and_lets_its_pages_go(tmp_path) -> None:
    start = {k: np.full(s, 0.25, np.float32) for k, s in SHAPES.items()}
    store = MappedBottom(tmp_path / "outer")
    mapped = run(Ledger(start, CONFIG, bottom=store))
    plain = run(Ledger(start, CONFIG))
    assert mapped.params_digest() == plain.params_digest()
    assert list((tmp_path / "outer").iterdir()) == []  # unlinked as soon as mapped
    bottom = mapped.snapshot().base_params  # a copy; the ledger settled its own arrays after reading
    assert bottom["w"].tobytes() == plain.snapshot().base_params["w"].tobytes()
    assert resident_bytes(mapped._bottom._theta["w"]) == 0
    loaded = Ledger.from_snapshot(LedgerSnapshot.from_bytes(mapped.snapshot().to_bytes()), CONFIG, bottom=store)
    assert loaded.params_digest() == plain.params_digest()


def test_files_left_by_a_killed_process_are_removed(tmp_path) -> None:
    (tmp_path / "outer").mkdir()
    (tmp_path / "outer" / "bottom-abc123").write_bytes(b"x" * 100)
    MappedBottom(tmp_path / "outer")
    assert list((tmp_path / "outer").iterdir()) == []


def test_a_restart_removes_the_blobs_its_previous_process_left(tmp_path) -> None:
    from node.outer.outer_files import remove_old_blobs

    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for data in (b"one", b"two" * 100):
        (blobs / hashlib.sha256(data).hexdigest()).write_bytes(data)
    (blobs / f"{'a' * 64}.1234.part").write_bytes(b"half")
    (blobs / "notes.txt").write_text("not a blob")  # a name the blob store never gives: left alone
    assert remove_old_blobs(blobs) == (3, 3 + 300 + 4)
    assert [p.name for p in blobs.iterdir()] == ["notes.txt"]
    assert remove_old_blobs(tmp_path / "absent") == (0, 0)


def test_freed_temporaries_leave_the_process() -> None:
    """With the node's allocator setting, a freed tensor-sized buffer is unmapped at once (glibc), in a
    fresh process (this one's heap holds whatever earlier tests freed)."""
    import subprocess
    import sys

    script = """
import sys
import numpy as np
from node.outer.outer_files import return_freed_memory
if not return_freed_memory():
    sys.exit(3)
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
for _ in range(3):  # without the setting glibc raises its threshold at the first free and keeps the next
    before = rss()
    a = np.ones(8 << 20, dtype=np.uint8)  # 8 MiB, under glibc's largest dynamic threshold (32 MiB)
    assert rss() - before >= 7 << 20, rss() - before
    del a
    assert rss() - before < 1 << 20, rss() - before
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    if done.returncode == 3:
        import pytest

        pytest.skip("not glibc")
    assert done.returncode == 0, done.stderr


def test_a_checkpoints_payloads_move_to_mapped_blob_files(tmp_path) -> None:
    """A restored snapshot's payloads leave memory for the blob store; the ledger it loads is the same."""
    from node.outer.outer_files import payloads_to_blobs
    from p2p.blobstore import BlobStore
    from protocol.compression import Codec, encode_tensors
    from protocol.ledger import Payload, PayloadDeltas

    shapes = {"emb": (64, 33), "w": (70_001,)}
    config = LedgerConfig(window=2, embeddings=frozenset({"emb"}))
    rng = np.random.default_rng(5)
    donor = Ledger({k: np.zeros(s, np.float32) for k, s in shapes.items()}, config)
    for r in range(4):
        for peer in range(2):
            data = encode_tensors({k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()},
                                  Codec.INT4)
            payload = Payload(Codec.INT4, data)
            meta = UpdateMeta(hashlib.sha256(f"{r}/{peer}".encode()).digest(), f"p{peer}", r, r, 64, 4)
            donor.add(meta, PayloadDeltas.validated(payload, shapes), payload=payload)
        donor.close_slot()
    snap = LedgerSnapshot.from_bytes(donor.snapshot().to_bytes())
    store = BlobStore(tmp_path / "blobs")
    moved, blobs = payloads_to_blobs(snap, store)
    assert len(blobs) == len(snap.entries) == len(store.names()) > 0
    for e in moved.entries:
        assert isinstance(e.payload.data, memoryview) and e.deltas.norms is not None  # mapped, not decoded again
    loaded = Ledger.from_snapshot(moved, config, shapes)
    assert (loaded.ledger_digest(), loaded.params_digest()) == (donor.ledger_digest(), donor.params_digest())
    assert sorted(slot for slot, _ in blobs) == sorted(e.meta.target_slot for e in snap.entries)


def test_the_own_updates_norms_measured_while_compressing_are_a_receivers() -> None:
    """`node.outer.updates.compress` measures the decode as the residual is made: the same norms a
    receiver's check (`PayloadDeltas.validated`) computes, so the ledger need not decode it again."""
    from node.outer.updates import compress
    from protocol.compression import Codec, ErrorFeedback
    from protocol.ledger import Payload, PayloadDeltas

    rng = np.random.default_rng(6)
    delta = {k: (rng.standard_normal(s) * 1e-3).astype(np.float32) for k, s in SHAPES.items()}
    payload, norms = compress(ErrorFeedback(Codec.INT4), delta)
    checked = PayloadDeltas.validated(Payload(Codec.INT4, payload), SHAPES)
    assert norms == checked.norms


def test_scratch_directories_of_killed_processes_are_removed(tmp_path, monkeypatch) -> None:
    import os
    import subprocess
    import sys
    import tempfile

    from node.outer.outer_files import SCRATCH_PREFIX, STALE_SCRATCH_S, scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    old = time.time() - 2 * STALE_SCRATCH_S
    left = tmp_path / f"{SCRATCH_PREFIX}{dead_pid}-abc"  # a killed node's blobs, untouched for long
    recent = tmp_path / f"{SCRATCH_PREFIX}{dead_pid}-def"  # the same pid, written to a moment ago: kept
    alive = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-ghi"  # a running process's: kept
    other = tmp_path / "diloco-node-x1y2z3"  # not ours (no pid): kept
    for d in (left, recent, alive, other):
        (d / "blobs").mkdir(parents=True)
        (d / "blobs" / "blob").write_bytes(b"x")
    for d in (left, alive, other):
        os.utime(d, (old, old))
    with scratch_dir() as scratch:
        assert Path(scratch).name.startswith(f"{SCRATCH_PREFIX}{os.getpid()}-") and Path(scratch).is_dir()
        assert not left.exists() and recent.exists() and alive.exists() and other.exists()
    assert not Path(scratch).exists()
