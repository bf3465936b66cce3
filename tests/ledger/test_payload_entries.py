"""Tier (a): the ledger keeps an update's payload, not its float32 deltas, and loses no bit by it; the
payload can be a memory-mapped blob file; old window slots keep no running sums and rebuild them."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from node.outer.outer_files import map_blob
from protocol.compression import BLOCK_SIZE, Codec, decode_span, decode_tensors, encode_tensors, record_offsets
from protocol.errors import LocalProtocolError
from protocol.ledger import Ledger, LedgerConfig, Outcome, Payload, UpdateMeta
from protocol.ledger.payload import PayloadDeltas

# Tensors longer than one ledger chunk (65,536 elements), one of odd length (int4 pads its last byte).
SHAPES = {"emb": (300, 7), "w": (70_001,), "x": (2, 65_600)}
CONFIG = LedgerConfig(window=3, embeddings=frozenset({"emb"}))


def update(tag: str, base: int, publish: int, codec: Codec) -> tuple[UpdateMeta, dict, Payload]:
    rng = np.random.default_rng(sum(tag.encode()))
    raw = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    data = encode_tensors(raw, codec)
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, 64, 4)
    return meta, decode_tensors(data, codec, SHAPES), Payload(codec, data)


@pytest.mark.parametrize("codec", list(Codec))
def test_a_span_decodes_to_the_same_bits_as_the_whole_payload(codec: Codec) -> None:
    _, full, payload = update("span", 0, 0, codec)
    offsets = record_offsets(SHAPES, codec)
    for name, shape in SHAPES.items():
        numel = math.prod(shape)
        for start in range(0, numel, 65_536):
            stop = min(numel, start + 65_536)
            got = decode_span(payload.data, codec, offsets[name], numel, name, start, stop)
            assert got.tobytes() == full[name].reshape(-1)[start:stop].tobytes()
    with pytest.raises(LocalProtocolError, match="block boundary"):
        decode_span(payload.data, codec, offsets["w"], 70_001, "w", BLOCK_SIZE // 2, 100)


def fill(led: Ledger, codec: Codec, with_payload: bool) -> None:
    """Four slots of two updates, then late updates for every window slot, newest first."""
    for r in range(1, 5):
        for who in ("a", "b"):
            meta, deltas, payload = update(f"{who}{r}", r - 1, r - 1, codec)
            led.add(meta, deltas, payload=payload if with_payload else None)
        led.close_slot()
    for r in (4, 3, 2):  # slot 4 keeps its running sums; slots 3 and 2 rebuild them from their entries
        meta, deltas, payload = update(f"late{r}", r - 1, r - 1, codec)
        assert led.add(meta, deltas, payload=payload if with_payload else None) is Outcome.FOLDED_LATE


@pytest.mark.parametrize("codec", [Codec.INT4, Codec.INT8, Codec.BF16])
def test_a_ledger_keeping_payloads_holds_the_same_bits_as_one_keeping_deltas(codec: Codec) -> None:
    start = {k: np.full(s, 0.5, np.float32) for k, s in SHAPES.items()}
    kept, bare = Ledger(start, CONFIG), Ledger(start, CONFIG)
    fill(kept, codec, with_payload=True)
    fill(bare, codec, with_payload=False)
    assert all(isinstance(e.deltas, PayloadDeltas) for e in kept.entries())
    assert not any(isinstance(e.deltas, PayloadDeltas) for e in bare.entries())
    assert kept.params_digest() == bare.params_digest() and kept.ledger_digest() == bare.ledger_digest()
    for name in SHAPES:  # the working state too: the same arithmetic on the same numbers
        assert kept.params(np.float64)[name].tobytes() == bare.params(np.float64)[name].tobytes()
    canonical, _ = kept.canonical_state()
    working = kept.params(np.float64)
    for name in SHAPES:  # late folds round (float32) in arrival order: equal up to that rounding
        assert np.linalg.norm(working[name] - canonical[name]) <= 1e-6 * np.linalg.norm(canonical[name])


def test_a_payload_can_stay_in_its_blob_file(tmp_path) -> None:
    """A memory-mapped blob is a payload like bytes, and the file may go while the ledger holds it."""
    start = {k: np.zeros(s, np.float32) for k, s in SHAPES.items()}
    mapped, inline = Ledger(start, CONFIG), Ledger(start, CONFIG)
    for r in range(1, 6):
        meta, deltas, payload = update(f"m{r}", r - 1, r - 1, Codec.INT4)
        path = tmp_path / meta.update_id.hex()
        path.write_bytes(payload.data)
        mapped.add(meta, deltas, payload=Payload(Codec.INT4, map_blob(path)))
        path.unlink()  # the blob store's garbage collection ran
        inline.add(meta, deltas, payload=payload)
        mapped.close_slot()
        inline.close_slot()
    assert mapped.params_digest() == inline.params_digest()
    assert Ledger.from_snapshot(mapped.snapshot(), CONFIG, SHAPES).params_digest() == inline.params_digest()
