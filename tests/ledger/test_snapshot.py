"""Snapshots: exact round trip, a joiner continues in lockstep, and strict refusal of anything malformed."""

import hashlib

import msgpack
import numpy as np
import pytest

from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot, Outcome, UpdateMeta
from snapshot_helpers import as_float64_base

SHAPES = {"emb": (4,), "w": (3, 2)}
CONFIG = LedgerConfig(window=2, embeddings=frozenset({"emb"}))


def update(tag, base, publish):
    rng = np.random.default_rng(sum(tag.encode()))
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, 64, 4)
    return meta, {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def busy_ledger():
    """Closed window slots, an open slot, a held future update, a stale one, a duplicate."""
    led = Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, CONFIG)
    for r in range(1, 5):
        led.add(*update(f"a{r}", r - 1, r - 1))
        led.add(*update(f"b{r}", max(0, r - 2), r - 1))
        led.close_slot()
    assert led.add(*update("late", 0, 0)) is Outcome.APPLIED_STALE
    assert led.add(*update("fold", 2, 3)) is Outcome.FOLDED_LATE
    assert led.add(*update("ahead", 4, 6)) is Outcome.HELD_FUTURE
    assert led.add(*update("a1", 0, 0)) is Outcome.DUPLICATE
    return led


def test_round_trip_is_exact_and_the_joiner_continues_in_lockstep():
    donor = busy_ledger()
    raw = donor.snapshot().to_bytes()
    snap = LedgerSnapshot.from_bytes(raw)
    assert snap.to_bytes() == raw
    joiner = Ledger.from_snapshot(snap, CONFIG, {k: s for k, s in SHAPES.items()})
    assert joiner.params_digest() == donor.params_digest()
    assert joiner.ledger_digest() == donor.ledger_digest()
    assert joiner.counters == donor.counters
    assert joiner.held_future() == donor.held_future() == {7: 1}
    for led in (donor, joiner):
        led.add(*update("fold2", 3, 4))
        led.add(*update("open", 4, 4))
        for _ in range(3):
            led.close_slot()
        led.add(*update("late2", 5, 5))
    assert joiner.params_digest() == donor.params_digest()
    # the working states differ only by the float32 rounding of the donor's earlier late folds
    np.testing.assert_allclose(joiner.params(np.float64)["w"], donor.params(np.float64)["w"], rtol=1e-6)
    assert joiner.add(*update("a1", 0, 0)) is Outcome.DUPLICATE  # dedup memory travels too


def test_a_restart_resumes_from_its_working_state_bit_for_bit():
    """A node's own checkpoint holds the working state with the snapshot (`Ledger.working_state`): the
    restored ledger is the one before the restart, bit for bit, without a replay, and stays so."""
    before = busy_ledger()  # its late fold left the working state a float32 rounding off the canonical one
    snap = LedgerSnapshot.from_bytes(before.snapshot().to_bytes())
    theta, v = before.working_state()
    after = Ledger.from_snapshot(snap, CONFIG, SHAPES, working=(theta, v))
    replayed = Ledger.from_snapshot(snap, CONFIG, SHAPES)
    for led in (before, after, replayed):
        led.add(*update("fold2", 3, 4))
        led.add(*update("open", 4, 4))
        led.close_slot()
        led.add(*update("late2", 4, 4))
    assert after.params_digest() == before.params_digest() == replayed.params_digest()
    for name in SHAPES:
        assert after.params()[name].tobytes() == before.params()[name].tobytes()
        assert after.momentum()[name].tobytes() == before.momentum()[name].tobytes()
    assert any(replayed.params()[n].tobytes() != before.params()[n].tobytes() for n in SHAPES)  # the rounding
    with pytest.raises(RemoteProtocolError, match="working θ"):
        Ledger.from_snapshot(snap, CONFIG, SHAPES, working=({"w": theta["w"]}, v))
    with pytest.raises(RemoteProtocolError, match="non-finite"):
        Ledger.from_snapshot(snap, CONFIG, SHAPES, working=(theta, {**v, "w": np.full((3, 2), np.nan, np.float32)}))


def mutate(raw, fn):
    doc = msgpack.unpackb(raw, raw=False)
    fn(doc)
    return msgpack.packb(doc, use_bin_type=True)


def set_(key, value):
    return lambda d: d.__setitem__(key, value)


BAD = [
    ("garbage", lambda raw: b"\xc1not msgpack"),
    ("truncated", lambda raw: raw[: len(raw) // 2]),
    ("not a map", lambda raw: msgpack.packb([1, 2])),
    ("extra key", lambda raw: mutate(raw, set_("extra", 1))),
    ("missing key", lambda raw: mutate(raw, lambda d: d.pop("chain"))),
    ("version", lambda raw: mutate(raw, set_("version", 4))),
    ("bool version", lambda raw: mutate(raw, set_("version", True))),
    ("v1 keys in v2", lambda raw: mutate(raw, lambda d: (d.pop("applied_tokens"), d.pop("applied_sum")))),
    ("v1 past slot 0", lambda raw: mutate(raw, lambda d: (d.update(version=1), d.pop("applied_tokens"),
                                                         d.pop("applied_sum")))),
    ("short applied_sum", lambda raw: mutate(raw, set_("applied_sum", b"\1" * 8))),
    ("negative applied_tokens", lambda raw: mutate(raw, set_("applied_tokens", -1))),
    ("negative slot", lambda raw: mutate(raw, set_("slot", -1))),
    ("bool slot", lambda raw: mutate(raw, set_("slot", True))),
    ("slot 2^64 - 1", lambda raw: mutate(raw, set_("slot", 2**64 - 1))),  # overflowed later in join and repair
    ("entry tokens 2^64 - 1", lambda raw: mutate(raw, lambda d: d["entries"][0].__setitem__(4, 2**64 - 1))),
    ("base above slot", lambda raw: mutate(raw, set_("base_slot", 99))),
    ("short chain", lambda raw: mutate(raw, set_("chain", b"x"))),
    ("ragged seen", lambda raw: mutate(raw, lambda d: d.__setitem__("seen", d["seen"][:-1]))),
    (
        "unsorted seen",
        lambda raw: mutate(
            raw, lambda d: d.__setitem__("seen", d["seen"][32:64] + d["seen"][:32] + d["seen"][64:])
        ),
    ),
    ("array length", lambda raw: mutate(raw, lambda d: d["base_params"].__setitem__("w", b"\0" * 8))),
    (
        "nan",
        lambda raw: mutate(raw, lambda d: d["base_momentum"].__setitem__("emb", np.full(4, np.nan).tobytes())),
    ),
    ("array names", lambda raw: mutate(raw, lambda d: d["base_params"].pop("emb"))),
    ("bad shape", lambda raw: mutate(raw, lambda d: d["shapes"].__setitem__("w", [3, -2]))),
    ("entry arity", lambda raw: mutate(raw, lambda d: d["entries"][0].pop())),
    ("entry id", lambda raw: mutate(raw, lambda d: d["entries"][0].__setitem__(0, b"short"))),
    ("entry deltas", lambda raw: mutate(raw, lambda d: d["entries"][0][7].__setitem__("w", b"\0" * 4))),
    ("counter type", lambda raw: mutate(raw, lambda d: d["counters"].__setitem__("duplicate", "1"))),
]


@pytest.mark.parametrize("name,corrupt", BAD, ids=[b[0] for b in BAD])
def test_malformed_bytes_are_refused(name, corrupt):
    raw = busy_ledger().snapshot().to_bytes()
    with pytest.raises(RemoteProtocolError) as err:
        LedgerSnapshot.from_bytes(corrupt(raw))
    assert err.value.reason is Reason.BAD_STATE


INCONSISTENT = [
    ("config", lambda d: d["config"].__setitem__("lr", 0.5)),
    ("window bottom", lambda d: d.__setitem__("base_slot", 1)),
    ("entry not in seen", lambda d: d.__setitem__("seen", d["seen"][32:])),
    ("duplicate entry", lambda d: d["entries"].append(d["entries"][0])),
    ("entry in wrong slot", lambda d: d["entries"][0].__setitem__(6, d["slot"] + 5)),
    ("bad entry header", lambda d: d["entries"][0].__setitem__(2, d["entries"][0][3] + 1)),
    ("unknown counter", lambda d: d["counters"].__setitem__("bogus", 1)),
]


@pytest.mark.parametrize("name,change", INCONSISTENT, ids=[c[0] for c in INCONSISTENT])
def test_inconsistent_snapshots_are_refused_on_load(name, change):
    raw = mutate(busy_ledger().snapshot().to_bytes(), change)
    with pytest.raises(RemoteProtocolError) as err:
        Ledger.from_snapshot(LedgerSnapshot.from_bytes(raw), CONFIG)
    assert err.value.reason is Reason.BAD_STATE


def test_model_shapes_must_match():
    snap = busy_ledger().snapshot()
    with pytest.raises(RemoteProtocolError):
        Ledger.from_snapshot(snap, CONFIG, {"emb": (4,), "w": (2, 3)})


def test_finalized_totals_travel_and_version_1_is_read_at_slot_0():
    donor = busy_ledger()
    snap = LedgerSnapshot.from_bytes(donor.snapshot().to_bytes())
    assert snap.applied_tokens == 64 * 4 and snap.applied_sum > 0  # slots 1 and 2 are final (two updates each)
    assert Ledger.from_snapshot(snap, CONFIG).totals() == donor.totals()
    young = Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, CONFIG)
    young.add(*update("a1", 0, 0))
    v1 = mutate(young.snapshot().to_bytes(), lambda d: (as_float64_base(d), d.update(version=1), d.pop("applied_tokens"),
                                                        d.pop("applied_sum")))
    loaded = Ledger.from_snapshot(LedgerSnapshot.from_bytes(v1), CONFIG)
    assert loaded.params_digest() == young.params_digest() and loaded.totals() == young.totals()


def test_a_config_comes_back_from_its_fingerprint_and_one_with_a_schedule_does_not() -> None:
    from protocol.errors import LocalProtocolError
    from protocol.ledger import LedgerConfig

    config = LedgerConfig(window=3, lr=0.5, embeddings=frozenset({"embed"}), norm_clip=2.0, max_step_rms=0.01,
                          tokens_per_step=64, max_inner_steps=10, direction_screen=None)
    assert LedgerConfig.from_fingerprint(config.fingerprint()) == config
    with pytest.raises(LocalProtocolError):
        LedgerConfig.from_fingerprint(LedgerConfig(lr_schedule=lambda slot: 0.1).fingerprint())
    with pytest.raises(LocalProtocolError):
        LedgerConfig.from_fingerprint({"window": 3, "colour": "red"})
