"""Snapshots (version 5, as in 4): an array or payload too big for one msgpack bin is stored as a list of bins.

The bin limit and the piece size are shrunk here (``_BIN_MAX``, ``_PIECE``) so a tiny ledger takes the
split path; ``test_snapshot_large.py`` crosses the real 4 GiB limits. Version 4 (float64 base state, every
blob split) is still read."""

import hashlib

import msgpack
import numpy as np
import pytest

import protocol.ledger.snapshot as snapshot_module
from protocol.compression import Codec, decode_tensors, encode_tensors
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot, Payload, UpdateMeta
from snapshot_helpers import as_float64_base

SHAPES = {"emb": (4,), "w": (3, 3)}
CONFIG = LedgerConfig(window=2, embeddings=frozenset({"emb"}))


def add(led, tag, base, publish, codec):
    rng = np.random.default_rng(sum(tag.encode()))
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, 64, 4)
    deltas = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    if codec is None:
        return led.add(meta, deltas)
    data = encode_tensors(deltas, codec)
    return led.add(meta, decode_tensors(data, codec, SHAPES), payload=Payload(Codec(codec), data))


def busy_ledger():
    """Finalized slots, int4 and fp32 payload entries, one float32 entry, a held future update."""
    led = Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, CONFIG)
    for r in range(1, 5):
        add(led, f"a{r}", r - 1, r - 1, "int4")
        add(led, f"b{r}", max(0, r - 2), r - 1, "fp32")
        led.close_slot()
    add(led, "late", 0, 0, None)
    add(led, "ahead", 4, 6, "int4")
    return led


@pytest.fixture
def small_bins(monkeypatch):
    """Bins of at most 20 bytes, cut into pieces of 16: the 9 float32 of `w` (36 bytes) need 3 bins, the 4
    of `emb` (16 bytes) fit one."""
    monkeypatch.setattr(snapshot_module, "_BIN_MAX", 20)
    monkeypatch.setattr(snapshot_module, "_PIECE", 16)


def test_snapshots_that_fit_are_written_with_one_bin_per_array():
    doc = msgpack.unpackb(busy_ledger().snapshot().to_bytes())
    assert doc["version"] == 5
    assert all(isinstance(b, bytes) for b in (*doc["base_params"].values(), *doc["base_momentum"].values()))
    assert len(doc["base_params"]["w"]) == 9 * 4  # float32


def test_split_blobs_round_trip_to_an_identical_ledger(small_bins):
    donor = busy_ledger()
    pieces = donor.snapshot().to_pieces()
    raw = b"".join(pieces)
    assert raw == donor.snapshot().to_bytes()
    doc = msgpack.unpackb(raw)
    assert doc["version"] == 5
    assert [len(b) for b in doc["base_params"]["w"]] == [16, 16, 4]
    assert isinstance(doc["base_params"]["emb"], bytes)  # only what does not fit is split
    fp32 = [e[7][1] for e in doc["entries"] if isinstance(e[7], list) and e[7][0] == "fp32"]
    assert fp32 and all(isinstance(p, list) for p in fp32)  # 52-byte payloads: split
    snap = LedgerSnapshot.from_bytes(raw)
    assert snap.to_bytes() == raw  # canonical: equal snapshots, equal bytes
    joiner = Ledger.from_snapshot(snap, CONFIG, SHAPES)
    assert joiner.ledger_digest() == donor.ledger_digest()
    assert joiner.params_digest() == donor.params_digest()
    payloads = {e.meta.update_id: e.payload for e in donor.entries()}
    assert {e.meta.update_id: e.payload for e in joiner.entries()} == payloads


def test_pieces_are_views_not_copies():
    snap = busy_ledger().snapshot()
    views = [p for p in snap.to_pieces() if isinstance(p, memoryview)]
    assert views and all(p.readonly for p in views)
    theta = np.ascontiguousarray(snap.base_params["w"], "<f4")
    assert any(np.shares_memory(np.frombuffer(p, np.uint8), theta) for p in views if len(p) == theta.nbytes)


def mutate(raw, fn):
    doc = msgpack.unpackb(raw, raw=False)
    fn(doc)
    return msgpack.packb(doc, use_bin_type=True)


def payload_entry(doc):
    return next(e for e in doc["entries"] if isinstance(e[7], list))


def float32_entry(doc):
    return next(e for e in doc["entries"] if isinstance(e[7], dict))


def split_payload(doc):
    return next(e for e in doc["entries"] if isinstance(e[7], list) and isinstance(e[7][1], list))


BAD = [
    ("as version 3", lambda d: d.__setitem__("version", 3)),  # what a version 3 reader would see, relabeled
    ("version 6", lambda d: d.__setitem__("version", 6)),
    ("no bins", lambda d: d["base_momentum"].__setitem__("emb", [])),
    ("not a bin", lambda d: d["base_params"]["w"].__setitem__(0, "text")),
    ("a bin short", lambda d: d["base_params"]["w"].pop()),
    ("a bin too many", lambda d: d["base_params"]["w"].append(b"\0" * 4)),
    ("a bare bin short", lambda d: d["base_params"].__setitem__("emb", d["base_params"]["emb"][:-4])),
    ("float32 entry bins", lambda d: float32_entry(d)[7]["w"].pop()),
    ("payload bins", lambda d: split_payload(d)[7][1].pop()),
    ("float64 base state", lambda d: as_float64_base(d, split=False)),  # a version 5 base state is float32
]


@pytest.mark.parametrize("name,change", BAD, ids=[b[0] for b in BAD])
def test_malformed_split_snapshots_are_refused_as_bad_state(small_bins, name, change):
    raw = mutate(busy_ledger().snapshot().to_bytes(), change)
    with pytest.raises(RemoteProtocolError) as err:
        LedgerSnapshot.from_bytes(raw)
    assert err.value.reason is Reason.BAD_STATE


def test_version_4_still_loads(small_bins):
    """A version 4 snapshot (float64 base state, every blob a list of bins) loads to the same state."""
    donor = busy_ledger()

    def as_version_4(doc):
        doc["version"] = 4
        as_float64_base(doc, split=True)
        for e in doc["entries"]:
            if isinstance(e[7], dict):
                e[7] = {n: raw if isinstance(raw, list) else [raw] for n, raw in e[7].items()}
            elif isinstance(e[7][1], bytes):
                e[7][1] = [e[7][1]]

    v4 = mutate(donor.snapshot().to_bytes(), as_version_4)
    joiner = Ledger.from_snapshot(LedgerSnapshot.from_bytes(v4), CONFIG, SHAPES)
    assert joiner.params_digest() == donor.params_digest()  # float32 values survive float64 exactly


def test_bins_may_be_cut_anywhere(small_bins):
    """The reader joins whatever bins it is given; only their concatenation counts."""
    donor = busy_ledger()
    raw = mutate(donor.snapshot().to_bytes(), lambda d: d["base_params"].__setitem__(
        "w", [b"".join(d["base_params"]["w"])[:5], b"".join(d["base_params"]["w"])[5:]]))
    assert Ledger.from_snapshot(LedgerSnapshot.from_bytes(raw), CONFIG).params_digest() == donor.params_digest()
