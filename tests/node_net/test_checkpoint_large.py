"""Tier (a), large: a checkpoint holding a ledger snapshot of over 4 GiB is written (streamed from the
snapshot's arrays, never joined) and loaded back whole.

The snapshot's arrays are ``np.zeros`` (pages mapped lazily), so writing holds no copy and loading holds
one (the 4 GiB ledger bytes it returns). Decoding such a snapshot is ``tests/ledger/test_snapshot_large.py``.
The files are deleted."""

import shutil
from pathlib import Path

import numpy as np
import psutil
import pytest

from node.checkpoint import Checkpoint, CheckpointDir
from protocol.ledger import LedgerSnapshot

GIB = 1 << 30


@pytest.mark.slow
def test_a_checkpoint_over_4_gib_is_written_and_resumed_from(tmp_path: Path) -> None:
    if psutil.virtual_memory().available < 6 * GIB or shutil.disk_usage(tmp_path).free < 6 * GIB:
        pytest.skip("needs 6 GiB of free memory and 6 GiB of free disk")
    numel = (1 << 29) + (1 << 16)  # float32 θ and momentum: 4 GiB + 512 KiB of snapshot
    zeros = {"w": np.zeros(numel, np.float32)}
    snap = LedgerSnapshot(slot=0, base_slot=0, config={}, shapes={"w": (numel,)}, base_params=zeros,
                          base_momentum={"w": np.zeros(numel, np.float32)}, entries=(), chain=bytes(32), seen=(),
                          counters={})
    pieces = snap.to_pieces()
    d = CheckpointDir(tmp_path / "ckpt", keep=1)
    try:
        path = d.save(Checkpoint({"round": 1}, pieces, {"step": np.asarray(7, np.int64)}, {}))
        assert path is not None and path.stat().st_size > 1 << 32
        got = d.latest()
        assert got is not None and got.round == 1 and int(got.inner["step"]) == 7
        assert len(got.ledger) == sum(map(len, pieces)) > 1 << 32
        loaded, at = np.frombuffer(got.ledger, np.uint8), 0
        for piece in map(memoryview, pieces):  # the ledger bytes are the pieces' concatenation
            for i in range(0, len(piece), 64 << 20):  # compared 64 MiB at a time
                chunk = np.frombuffer(piece[i: i + (64 << 20)], np.uint8)
                assert np.array_equal(loaded[at: at + len(chunk)], chunk)
                at += len(chunk)
    finally:
        shutil.rmtree(d.directory)
