"""Tier (a): the state sync's meta and bottom index (`protocol.ledger.statesync`): the index's tree digest is
the ledger's bottom digest (whatever the bottom's dtype), the pieces tile the bottom's byte string, the
meta round-trips, and `verify_meta` refuses a meta that is not the signed state."""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest

from protocol.compression import Codec, decode_tensors, encode_tensors
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, Payload, UpdateMeta
from protocol.ledger.digest import PIECE, state_digest, tree_digest
from protocol.ledger.statesync import BOTTOM_DOMAIN, BottomIndex, StateMeta, bottom_arrays, verify_meta

SHAPES = {"b": (3,), "w": (PIECE // 4 + 5,)}  # theta/w and momentum/w: at least two pieces each
CONFIG = LedgerConfig(window=2)


def busy_ledger() -> Ledger:
    led = Ledger({n: np.linspace(-1, 1, s[0], dtype=np.float32) for n, s in SHAPES.items()}, CONFIG)
    rng = np.random.default_rng(0)
    for r in range(4):
        deltas = {n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()}
        data = encode_tensors(deltas, Codec.INT4)
        meta = UpdateMeta(hashlib.sha256(b"u%d" % r).digest(), "p", r, r, 100, 5)
        led.add(meta, decode_tensors(data, Codec.INT4, SHAPES), payload=Payload(Codec.INT4, data))
        if r < 3:
            led.close_slot()
    return led


def meta_of(led: Ledger) -> StateMeta:
    snap = led.snapshot()
    blobs = {e.meta.update_id: (e.payload.codec, hashlib.sha256(e.payload.data).hexdigest(), len(e.payload.data))
             for e in snap.entries}
    return StateMeta.of_snapshot(snap, blobs, BottomIndex.of_arrays(bottom_arrays(snap)))


def test_the_index_gives_the_ledgers_bottom_and_params_digests() -> None:
    led = busy_ledger()
    index = BottomIndex.of_arrays(bottom_arrays(led.snapshot()))
    assert index.digest() == led.bottom_digest()
    assert state_digest(index.digest(), led.ledger_digest()) == led.params_digest()
    assert [a.name for a in index.arrays] == ["momentum/b", "momentum/w", "theta/b", "theta/w"]
    assert [len(a.hashes) for a in index.arrays] == [-(-a.nbytes // PIECE) for a in index.arrays]
    assert len(index.arrays[-1].hashes) >= 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_dtype_is_the_arrays_own(dtype: type) -> None:
    arrays = {"theta/w": np.arange(PIECE // 2, dtype=dtype), "momentum/w": np.ones(7, dtype=dtype)}
    index = BottomIndex.of_arrays(arrays)
    assert {a.dtype for a in index.arrays} == {np.dtype(dtype).newbyteorder("<").str}
    assert index.digest() == tree_digest(arrays, BOTTOM_DOMAIN)


def test_pieces_tile_the_bottom_and_views_read_it_back() -> None:
    arrays = bottom_arrays(busy_ledger().snapshot())
    index = BottomIndex.of_arrays(arrays)
    pieces = index.pieces()
    assert [p.index for p in pieces] == list(range(len(pieces)))
    assert pieces[0].offset == 0 and all(a.offset + a.length == b.offset for a, b in zip(pieces, pieces[1:]))
    assert pieces[-1].offset + pieces[-1].length == index.nbytes and max(p.length for p in pieces) == PIECE
    blob = b"".join(np.ascontiguousarray(arrays[a.name]).tobytes() for a in index.arrays)
    assert all(hashlib.sha256(blob[p.offset:p.offset + p.length]).digest() == p.sha256 for p in pieces)
    views = index.views(blob)
    assert set(views) == set(arrays) and all(np.array_equal(views[n], arrays[n]) for n in arrays)


def test_the_meta_round_trips_and_verifies_against_the_signed_digests() -> None:
    led = busy_ledger()
    meta = meta_of(led)
    again = StateMeta.from_bytes(meta.to_bytes())
    assert again == meta and again.to_bytes() == meta.to_bytes()
    assert len(meta.to_bytes()) < 2000, "no arrays and no payload bytes in the meta"
    verify_meta(again, led.slot, led.ledger_digest(), led.params_digest())
    assert again.view() == led.view()


def test_a_meta_that_is_not_the_signed_state_is_refused() -> None:
    led = busy_ledger()
    meta = meta_of(led)
    bad_piece = dataclasses.replace(meta.bottom.arrays[1], hashes=(bytes(32), meta.bottom.arrays[1].hashes[1]))
    forged = dataclasses.replace(meta, bottom=BottomIndex((meta.bottom.arrays[0], bad_piece, *meta.bottom.arrays[2:])))
    cases = [
        (forged, led.slot, led.ledger_digest(), led.params_digest()),  # a piece hash the signer never hashed
        (meta, led.slot + 1, led.ledger_digest(), led.params_digest()),
        (meta, led.slot, bytes(32), led.params_digest()),
        (dataclasses.replace(meta, entries=meta.entries[1:]), led.slot, led.ledger_digest(), led.params_digest()),
        # finalized totals raised: they are inside the ledger digest, so no longer a donor's word alone
        (dataclasses.replace(meta, applied_tokens=meta.applied_tokens + 2**40), led.slot, led.ledger_digest(),
         led.params_digest()),
        (dataclasses.replace(meta, applied_sum=meta.applied_sum + 1), led.slot, led.ledger_digest(), led.params_digest()),
    ]
    for case in cases:
        with pytest.raises(RemoteProtocolError) as err:
            verify_meta(*case)
        assert err.value.reason is Reason.BAD_STATE


@pytest.mark.parametrize("change", [
    lambda d: d.update(version=2),
    lambda d: d["bottom"][0].__setitem__(1, "<i8"),  # not a float dtype
    lambda d: d["bottom"][0].__setitem__(0, "theta/b"),  # wrong name or order
    lambda d: d["bottom"][1].__setitem__(3, d["bottom"][1][3][:32]),  # one hash short
    lambda d: d["bottom"][1].__setitem__(2, [5]),  # not the model's shape
    lambda d: d["entries"][0].__setitem__(9, 7),  # payload size not the codec's for the shapes
    lambda d: d["entries"][0].__setitem__(7, "zip"),
    lambda d: d["entries"].reverse(),
    lambda d: d.pop("seen"),
])
def test_malformed_metas_are_a_bad_state(change) -> None:
    doc = msgpack.unpackb(meta_of(busy_ledger()).to_bytes(), raw=False)
    change(doc)
    with pytest.raises(RemoteProtocolError) as err:
        StateMeta.from_bytes(msgpack.packb(doc, use_bin_type=True))
    assert err.value.reason is Reason.BAD_STATE


def test_the_module_is_sans_io() -> None:
    code = ("import sys, protocol.ledger.statesync\n"
            "bad = [m for m in ('trio', 'httpx', 'socket', 'jax', 'hypercorn') if m in sys.modules]\nassert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_an_entry_is_checked_against_its_origins_signature_and_its_proof_travels_in_the_meta() -> None:
    from protocol.ledger.proof import check_entry
    from protocol.ledger.statesync import MetaEntry
    from signed_updates import signed_update

    shapes = SHAPES
    deltas = {n: np.full(s, 0.5, np.float32) for n, s in shapes.items()}
    meta, _, payload, proof = signed_update("r", shapes, deltas, seed=1, base=2, publish=3, tokens=64)
    blob, size = hashlib.sha256(payload.data).hexdigest(), len(payload.data)
    signed = check_entry("r", meta, payload.codec, blob, size, shapes, proof)
    assert signed.message_id == meta.update_id and signed.body.tokens == 64

    def refused(**changes) -> str:
        args = dict(run_id="r", meta=meta, codec=payload.codec, blob=blob, size=size, shapes=shapes, proof=proof)
        args.update(changes)
        with pytest.raises(RemoteProtocolError) as err:
            check_entry(args["run_id"], args["meta"], args["codec"], args["blob"], args["size"], args["shapes"],
                        args["proof"])
        assert err.value.reason is Reason.BAD_STATE
        return err.value.detail

    assert "no signature" in refused(proof=None)
    assert "does not verify" in refused(meta=dataclasses.replace(meta, tokens=10**6))  # an inflated claim
    assert "does not verify" in refused(run_id="another-run")
    assert "does not verify" in refused(blob="00" * 32)  # another payload
    assert "id is not" in refused(meta=dataclasses.replace(meta, update_id=bytes(32)))
    refused(proof=dataclasses.replace(proof, seqno=proof.seqno + 1))

    entry = MetaEntry(meta, 4, payload.codec, blob, size, proof)
    bare = MetaEntry(dataclasses.replace(meta, update_id=b"\x01" * 32), 4, payload.codec, blob, size)
    entries = tuple(sorted((entry, bare), key=lambda e: e.meta.update_id))
    snapshot_meta = dataclasses.replace(meta_of(busy_ledger()), entries=entries)
    again = StateMeta.from_bytes(snapshot_meta.to_bytes())
    assert again.entries == entries
    assert {e.meta.update_id: e.proof for e in again.entries} == {meta.update_id: proof, bare.meta.update_id: None}
