"""Snapshot version 3: entries that carry their encoded payload travel as the payload (exact round trip,
much smaller for int4), version 2 still loads, and a malformed payload is refused as a bad state."""

import dataclasses
import hashlib

import msgpack
import numpy as np
import pytest

from protocol.compression import Codec, decode_tensors, encode_tensors
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot, Outcome, Payload, UpdateMeta
from snapshot_helpers import as_float64_base

SHAPES = {"emb": (4,), "w": (3, 3)}  # 9 elements: int4 pads the last byte
CONFIG = LedgerConfig(window=2, embeddings=frozenset({"emb"}))


def meta(tag, base, publish):
    return UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, 64, 4)


def raw_update(tag, base, publish, shapes=SHAPES):
    rng = np.random.default_rng(sum(tag.encode()))
    return meta(tag, base, publish), {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def encoded_update(tag, base, publish, codec, shapes=SHAPES):
    """(meta, deltas, payload) with deltas the exact decode of the payload, as a node adds them."""
    m, deltas = raw_update(tag, base, publish, shapes)
    data = encode_tensors(deltas, codec)
    return m, decode_tensors(data, codec, shapes), Payload(Codec(codec), data)


def add(led, tag, base, publish, codec):
    """Add an update with its payload (``codec``) or as bare float32 deltas (``codec`` None)."""
    if codec is None:
        return led.add(*raw_update(tag, base, publish))
    m, deltas, payload = encoded_update(tag, base, publish, codec)
    return led.add(m, deltas, payload=payload)


def busy_ledger(codec):
    """Closed window slots, an open slot, a held future update, a stale one without payload, a fold."""
    led = Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, CONFIG)
    for r in range(1, 5):
        add(led, f"a{r}", r - 1, r - 1, codec)
        add(led, f"b{r}", max(0, r - 2), r - 1, codec)
        led.close_slot()
    assert add(led, "late", 0, 0, None) is Outcome.APPLIED_STALE
    assert add(led, "fold", 2, 3, codec) is Outcome.FOLDED_LATE
    assert add(led, "ahead", 4, 6, codec) is Outcome.HELD_FUTURE
    return led


def mutate(raw, fn):
    doc = msgpack.unpackb(raw, raw=False)
    fn(doc)
    return msgpack.packb(doc, use_bin_type=True)


def first_payload_entry(doc):
    return next(e for e in doc["entries"] if isinstance(e[7], list))


@pytest.mark.parametrize("codec", ["int4", "fp32", "int8", "bf16"])
def test_payload_entries_round_trip_to_an_identical_ledger(codec):
    donor = busy_ledger(codec)
    raw = donor.snapshot().to_bytes()
    snap = LedgerSnapshot.from_bytes(raw)
    assert snap.to_bytes() == raw
    kinds = sorted(e.payload is None for e in snap.entries)
    assert kinds.count(True) == 1 and len(kinds) == 7  # only the stale update was added without payload
    joiner = Ledger.from_snapshot(snap, CONFIG, SHAPES)
    assert joiner.ledger_digest() == donor.ledger_digest()
    assert joiner.params_digest() == donor.params_digest()
    assert joiner.params_digest() == donor.params_digest()
    assert joiner.snapshot().to_bytes() == raw  # equal states, equal bytes
    payloads = {e.meta.update_id: e.payload for e in donor.entries()}
    assert {e.meta.update_id: e.payload for e in joiner.entries()} == payloads
    for e in joiner.entries():
        if e.payload is not None:
            decoded = decode_tensors(e.payload.data, e.payload.codec, SHAPES)
            assert all(np.array_equal(decoded[n], e.deltas[n]) for n in SHAPES)


def test_version_2_snapshots_still_load():
    donor = busy_ledger("int4")

    def as_version_2(doc):
        doc["version"] = 2
        as_float64_base(doc)
        for e in doc["entries"]:
            if isinstance(e[7], list):
                codec, data = e[7]
                e[7] = {n: a.tobytes() for n, a in decode_tensors(data, codec, SHAPES).items()}

    v2 = mutate(donor.snapshot().to_bytes(), as_version_2)
    loaded = Ledger.from_snapshot(LedgerSnapshot.from_bytes(v2), CONFIG, SHAPES)
    assert loaded.ledger_digest() == donor.ledger_digest()
    assert loaded.params_digest() == donor.params_digest()
    assert all(e.payload is None for e in loaded.entries())
    assert msgpack.unpackb(loaded.snapshot().to_bytes())["version"] == 5


def _set_payload(codec=None, data=None, transform=None):
    def change(doc):
        entry = first_payload_entry(doc)
        old_codec, old_data = entry[7]
        entry[7] = [old_codec if codec is None else codec, transform(old_data) if transform else data or old_data]

    return change


def _nan_scale(data):  # int4: the first tensor's first block scale becomes a bfloat16 NaN
    return b"\xc0\x7f" + data[2:]


BAD_PAYLOADS = [
    ("truncated", "int4", _set_payload(transform=lambda d: d[:-1])),
    ("oversized", "int4", _set_payload(transform=lambda d: d + b"\0")),
    ("unknown codec", "int4", _set_payload(codec="int3")),
    ("other codec", "int4", _set_payload(codec="int8")),
    ("codec not a string", "int4", _set_payload(codec=4)),
    ("payload not bytes", "int4", _set_payload(transform=lambda d: list(d))),
    ("nan scale", "int4", _set_payload(transform=_nan_scale)),
    ("nan value", "fp32", _set_payload(transform=lambda d: np.full(13, np.nan, "<f4").tobytes())),
    ("padding nibble", "int4", _set_payload(transform=lambda d: d[:-1] + bytes([d[-1] | 0xF0]))),
    ("arity", "int4", lambda doc: first_payload_entry(doc)[7].append(b"")),
    ("payload in version 2", "int4", lambda doc: doc.__setitem__("version", 2)),
]


@pytest.mark.parametrize("name,codec,change", BAD_PAYLOADS, ids=[b[0] for b in BAD_PAYLOADS])
def test_malformed_payloads_are_refused_as_bad_state(name, codec, change):
    raw = mutate(busy_ledger(codec).snapshot().to_bytes(), change)
    with pytest.raises(RemoteProtocolError) as err:
        LedgerSnapshot.from_bytes(raw)
    assert err.value.reason is Reason.BAD_STATE


def test_add_refuses_a_payload_that_cannot_encode_the_deltas_and_changes_nothing():
    led = busy_ledger("int4")
    before = led.snapshot().to_bytes()
    m, deltas, payload = encoded_update("x", 4, 4, "int4")
    with pytest.raises(LocalProtocolError):
        led.add(m, deltas, payload=Payload(Codec.INT4, payload.data[:-1]))
    with pytest.raises(LocalProtocolError):
        led.add(m, deltas, payload=(Codec.INT4, payload.data))
    with pytest.raises(LocalProtocolError):
        Payload("int5", payload.data)
    assert Payload("int4", payload.data).codec is Codec.INT4  # a built-in's name is taken as its Codec
    assert led.snapshot().to_bytes() == before and not led.has_seen(m.update_id)


def test_carry_from_keeps_the_payloads():
    old = busy_ledger("int4")
    new = Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, CONFIG)
    carried, _ = new.carry_from(old)
    assert carried == len(old.entries()) == 7
    payloads = {e.meta.update_id: e.payload for e in new.entries()}
    assert payloads == {e.meta.update_id: e.payload for e in old.entries()}
    assert sum(p is not None for p in payloads.values()) == 6  # all but the stale one, added without


def _entries_bytes(snap):
    return len(snap.to_bytes()) - len(dataclasses.replace(snap, entries=()).to_bytes())


def test_int4_payload_entries_are_over_6x_smaller_than_float32():
    shapes = {"emb": (64, 32), "w": (128, 64)}
    params = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    with_payloads = Ledger(params, CONFIG)
    without = Ledger(params, CONFIG)
    for s in range(1, 4):
        for k in range(3):
            m, deltas, payload = encoded_update(f"{s}/{k}", s - 1, s - 1, "int4", shapes)
            with_payloads.add(m, deltas, payload=payload)
            without.add(m, deltas)
        with_payloads.close_slot(), without.close_slot()
    small, large = with_payloads.snapshot(), without.snapshot()
    assert with_payloads.params_digest() == without.params_digest()
    ratio = _entries_bytes(large) / _entries_bytes(small)
    assert ratio > 6, ratio
    assert len(small.to_bytes()) < len(large.to_bytes())
