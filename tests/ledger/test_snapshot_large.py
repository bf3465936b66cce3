"""Snapshots past msgpack's 4 GiB limits: a ~4 GiB snapshot round trips through ``to_bytes``/``from_bytes``,
and a tensor too big for one bin is stored as a list of bins.

The arrays are ``np.zeros`` (pages mapped lazily: no memory until written), so the round trip holds two
copies at most: the encoding and the decoded arrays (~8.3 GiB; the machine has 24)."""

import msgpack
import numpy as np
import psutil
import pytest

import protocol.ledger.snapshot as snapshot_module
from protocol.ledger import LedgerSnapshot

GIB = 1 << 30


def zero_snapshot(numel: int) -> LedgerSnapshot:
    return LedgerSnapshot(slot=0, base_slot=0, config={}, shapes={"w": (numel,)}, base_params={"w": np.zeros(numel, np.float32)},
                          base_momentum={"w": np.zeros(numel, np.float32)}, entries=(), chain=bytes(32), seen=(), counters={})


@pytest.mark.slow
def test_a_snapshot_over_4_gib_round_trips():
    if psutil.virtual_memory().available < 10 * GIB:
        pytest.skip("needs 10 GiB of free memory")
    numel = (1 << 29) + (1 << 16)  # two 2 GiB float32 arrays: each fits a bin, the whole does not fit 4 GiB
    raw = zero_snapshot(numel).to_bytes()
    assert len(raw) > 1 << 32
    snap = LedgerSnapshot.from_bytes(raw)
    del raw
    assert snap.shapes == {"w": (numel,)}
    assert not snap.base_params["w"].any() and not snap.base_momentum["w"].any()


def test_a_tensor_over_4_gib_is_split_into_bins():
    """2^30 + 1 float32 (4 GiB + 4 bytes) fits no bin: pieces of 1 GiB; nothing is copied."""
    numel = (1 << 30) + 1
    before = psutil.Process().memory_info().rss
    pieces = zero_snapshot(numel).to_pieces()
    assert psutil.Process().memory_info().rss - before < 64 << 20  # views of the untouched zeros
    head = msgpack.Unpacker()
    head.feed(b"".join(pieces[:5]))
    assert head.read_map_header() == 14 and [head.unpack() for _ in range(4)] == [
        "format", "diloco-ledger-snapshot", "version", 5]
    assert max(map(len, pieces)) == snapshot_module._PIECE == GIB
    assert sum(map(len, pieces)) > 2 * numel * 4
