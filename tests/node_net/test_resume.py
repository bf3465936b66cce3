"""Tier (a): a checkpoint's ledger part (`node.outer.resume`) — the payloads stay in the blob store, a restore
resumes bit for bit without decoding them or replaying the window, and a missing or damaged payload blob makes
the checkpoint unusable with its reason."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from node.checkpoint import Checkpoint, CheckpointDir, CheckpointError
from node.outer.outer_files import MappedBottom, map_blob, payload_blob, remove_old_blobs
from node.outer.resume import encode_ledger_part, newest_checkpoint, referenced_blobs, restore_ledger
from p2p.blobstore import BlobStore
from protocol.compression import Codec, encode_tensors
from protocol.ledger import Ledger, LedgerConfig, Outcome, Payload, PayloadDeltas, UpdateMeta

SHAPES = {"emb": (64, 8), "w": (40, 33)}
CONFIG = LedgerConfig(window=2, embeddings=frozenset({"emb"}))


def update(store: BlobStore | None, tag: str, base: int, publish: int):
    """An update whose payload is mapped from `store` (as a node keeps every payload), or bytes in memory."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(tag.encode()).digest()[:8], "big"))
    deltas = {k: (rng.standard_normal(s) * 1e-2).astype(np.float32) for k, s in SHAPES.items()}
    data = encode_tensors(deltas, Codec.INT8)
    payload = Payload(Codec.INT8, map_blob(store.path(store.put(data))) if store is not None else data)
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, 64, 4)
    return meta, PayloadDeltas.validated(payload, SHAPES), payload


def busy_ledger(tmp_path: Path, store: BlobStore) -> Ledger:
    led = Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, CONFIG, bottom=MappedBottom(tmp_path / "a"))
    for r in range(1, 5):
        led.add(*update(store, f"a{r}", r - 1, r - 1))
        led.add(*update(store, f"b{r}", max(0, r - 2), r - 1))
        led.close_slot()
    assert led.add(*update(store, "fold", 2, 3)) is Outcome.FOLDED_LATE  # the working state is off the canonical
    assert led.add(*update(None, "in-memory", 4, 4)) is Outcome.APPLIED_OPEN  # a payload held only in memory
    assert led.add(*update(store, "ahead", 4, 6)) is Outcome.HELD_FUTURE
    return led


def checkpoint(tmp_path: Path, led: Ledger, store: BlobStore) -> tuple[Checkpoint, frozenset[str]]:
    part = encode_ledger_part(led.snapshot(), led.working_state(), led.bottom_rows(), store)
    directory = CheckpointDir(tmp_path / "ckpt")
    path = directory.save(Checkpoint({"round": 4}, part.data, {}, {}, part.outer))
    assert path is not None
    return directory.latest(), part.blobs


def test_a_restore_resumes_bit_for_bit_with_the_payloads_left_in_the_blob_store(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    before = busy_ledger(tmp_path, store)
    ckpt, blobs = checkpoint(tmp_path, before, store)
    assert ckpt.version == 3 and referenced_blobs(ckpt) == blobs
    newest, kept, seen = newest_checkpoint(CheckpointDir(tmp_path / "ckpt"))
    assert newest.round == 4 and kept == blobs and seen == before.seen_ids() and len(seen) >= 5
    assert len(blobs) == len(before.entries())  # every window entry's payload, the in-memory one put there
    payload_bytes = sum(store.size(b) for b in blobs)
    assert len(ckpt.ledger) < payload_bytes // 4  # the checkpoint refers to the payloads, it does not hold them
    after, snap, rehomed = restore_ledger(ckpt, CONFIG, SHAPES, MappedBottom(tmp_path / "b"), store)
    assert sorted(b for _, b in rehomed) == sorted(blobs)
    assert all(payload_blob(e.payload) in blobs for e in snap.entries)  # mapped from the store
    assert after.params_digest() == before.params_digest() and after.ledger_digest() == before.ledger_digest()
    for led in (before, after):  # and they go on alike
        led.add(*update(store, "next", 4, 4))
        led.close_slot()
        led.add(*update(store, "late", 3, 4))
    assert after.params_digest() == before.params_digest()
    for name in SHAPES:
        assert after.params()[name].tobytes() == before.params()[name].tobytes()
        assert after.momentum()[name].tobytes() == before.momentum()[name].tobytes()


def test_a_missing_or_damaged_payload_blob_makes_the_checkpoint_unusable(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    ckpt, blobs = checkpoint(tmp_path, busy_ledger(tmp_path, store), store)
    first, second = sorted(blobs)[:2]
    path = store.path(first)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"payload blob {first[:12]} is damaged"):
        restore_ledger(ckpt, CONFIG, SHAPES, MappedBottom(tmp_path / "b"), BlobStore(tmp_path / "blobs"))
    store.remove(second)
    with pytest.raises(CheckpointError, match=f"payload blob {second[:12]} is not in the blob store"):
        restore_ledger(ckpt, CONFIG, SHAPES, MappedBottom(tmp_path / "c"), store)


def test_a_restart_keeps_the_blobs_its_checkpoint_refers_to(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    ckpt, blobs = checkpoint(tmp_path, busy_ledger(tmp_path, store), store)
    old = store.put(b"a payload of a slot long final")
    unreferenced = {p.name for p in (tmp_path / "blobs").iterdir()} - blobs  # slots that left the window, and `old`
    removed, _ = remove_old_blobs(tmp_path / "blobs", referenced_blobs(ckpt))
    assert old in unreferenced and removed == len(unreferenced) and not (tmp_path / "blobs" / old).exists()
    assert all((tmp_path / "blobs" / b).exists() for b in blobs)
    restore_ledger(ckpt, CONFIG, SHAPES, MappedBottom(tmp_path / "b"), BlobStore(tmp_path / "blobs"))


def test_a_checkpoint_refers_only_to_blobs_in_the_store_and_keeps_them_until_released(tmp_path: Path) -> None:
    """A window payload whose blob was removed after it was mapped (a failed state download forgot what it had
    fetched, while gossip brought the same update) is put back; every referenced blob is kept in the store, so
    a removal before the next checkpoint cannot leave this one pointing at a missing file."""
    store = BlobStore(tmp_path / "blobs")
    led = busy_ledger(tmp_path, store)
    gone = sorted(payload_blob(e.payload) for e in led.snapshot().entries if payload_blob(e.payload))[0]
    store.remove(gone)
    assert not (tmp_path / "blobs" / gone).exists()
    part = encode_ledger_part(led.snapshot(), led.working_state(), led.bottom_rows(), store)
    assert gone in part.blobs and all(store.has(b) for b in part.blobs), "put back from the mapped payload"
    for blob in part.blobs:
        store.remove(blob)  # the clean-up, or a failed download, while the checkpoint still counts
    assert all((tmp_path / "blobs" / b).exists() for b in part.blobs)
    store.release(part.blobs)  # a newer checkpoint replaced it
    assert not any((tmp_path / "blobs" / b).exists() for b in part.blobs)
