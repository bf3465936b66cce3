"""Tier (a): a codec written outside the package (tests/plugins.py: IEEE half precision) registered in one
place, `protocol.compression.formats.register_codec`, and taken from then on by every path that takes a codec
name: payload sizes, encoding with error feedback, decoding whole and span by span, a peer's bad bytes
refused by reason, the ledger's payload entries and their snapshots. Replicas that hold its payloads agree
bit for bit."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from plugins import FP16

from protocol.compression import ErrorFeedback, decode_span, decode_tensors, encode_tensors, payload_size, record_offsets
from protocol.compression.formats import CodecSpec, as_codec_remote, codec_names, register_codec
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot, Payload, UpdateMeta

SHAPES = {"emb": (70_000,), "w": (3, 5)}  # emb spans two of the ledger's 65,536-element chunks


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def test_a_registered_codec_encodes_sizes_and_decodes_like_a_built_in() -> None:
    assert FP16.name in codec_names() and as_codec_remote(FP16.name) == FP16.name
    x = _tensors(1)
    payload = encode_tensors(x, FP16.name)
    assert len(payload) == payload_size(SHAPES, FP16.name) == 2 * (70_000 + 15)
    decoded = decode_tensors(payload, FP16.name, SHAPES)
    for k in SHAPES:
        assert decoded[k].dtype == np.float32 and np.array_equal(decoded[k], x[k].astype(np.float16).astype(np.float32))
    offsets = record_offsets(SHAPES, FP16.name)
    span = decode_span(payload, FP16.name, offsets["emb"], 70_000, "emb", 65_536, 70_000)
    assert np.array_equal(span, decoded["emb"][65_536:])
    feedback = ErrorFeedback(FP16.name)
    sent, dequantized = feedback.compress(x)
    assert sent == payload and all(np.array_equal(dequantized[k], decoded[k]) for k in SHAPES)


def test_names_are_registered_once_and_a_peers_bad_bytes_are_refused_by_reason() -> None:
    with pytest.raises(LocalProtocolError, match="already registered"):
        register_codec(CodecSpec("int4", FP16.record_bytes, FP16.encode, FP16.decode))
    with pytest.raises(LocalProtocolError, match="1-16 printable"):
        register_codec(CodecSpec("a-name-longer-than-sixteen", FP16.record_bytes, FP16.encode, FP16.decode))
    with pytest.raises(RemoteProtocolError) as unknown:
        as_codec_remote("fp8-someday")
    assert unknown.value.reason is Reason.BAD_CODEC
    payload = bytearray(encode_tensors(_tensors(2), FP16.name))
    payload[-2:] = np.array([np.nan], dtype="<f2").tobytes()  # the last value of `w`: a NaN half
    with pytest.raises(RemoteProtocolError) as nan:
        decode_tensors(bytes(payload), FP16.name, SHAPES)
    assert nan.value.reason is Reason.NON_FINITE
    with pytest.raises(RemoteProtocolError) as short:
        decode_tensors(bytes(payload[:-2]), FP16.name, SHAPES)
    assert short.value.reason is Reason.SHAPE_MISMATCH
    lying = CodecSpec("test-short", FP16.record_bytes, FP16.encode, lambda r, n, a, b: np.zeros(b - a - 1, np.float32))
    if lying.name not in codec_names():
        register_codec(lying)
    with pytest.raises(RemoteProtocolError) as malformed:
        decode_tensors(encode_tensors(_tensors(3), "test-short"), "test-short", SHAPES)
    assert malformed.value.reason is Reason.MALFORMED


def test_replicas_holding_a_registered_codecs_payloads_agree_and_snapshot_them() -> None:
    config = LedgerConfig(window=2, embeddings=frozenset({"emb"}))
    updates = []
    for i, (origin, slot) in enumerate([(o, s) for s in (1, 2, 3) for o in range(3)]):
        data = encode_tensors(_tensors(10 + i), FP16.name)
        meta = UpdateMeta(hashlib.sha256(b"u%d" % i).digest(), f"peer{origin}", slot - 1, slot - 1, 100, 10)
        updates.append((meta, decode_tensors(data, FP16.name, SHAPES), Payload(FP16.name, data)))
    digests = set()
    for seed in range(3):
        ledger = Ledger(_tensors(0), config)
        pending = list(updates)
        random.Random(seed).shuffle(pending)
        while pending or ledger.slot < 3:
            lowest = min((m.target_slot for m, _, _ in pending), default=99)
            if pending and (ledger.slot >= 3 or ledger.slot + 1 - config.window >= lowest or seed % 2):
                meta, deltas, payload = pending.pop()
                ledger.add(meta, deltas, payload=payload)
            else:
                ledger.close_slot()
        restored = Ledger.from_snapshot(LedgerSnapshot.from_bytes(ledger.snapshot().to_bytes()), config, ledger.shapes)
        assert restored.params_digest() == ledger.params_digest()
        digests.add((ledger.ledger_digest(), ledger.params_digest()))
    assert len(digests) == 1
