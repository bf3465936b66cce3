"""The ledger state machine: outcomes and counters, validation, folds, stale and future updates, digests."""

import hashlib

import numpy as np
import pytest

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, Outcome, StalePolicy, UpdateMeta

SHAPES = {"emb": (4,), "w": (3, 2)}


def params(seed=0):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def update(tag, base, publish, tokens=100, steps=10, seed=None):
    rng = np.random.default_rng(
        seed if seed is not None else int.from_bytes(tag.encode()[:8].ljust(8, b"\0"), "little")
    )
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag.split("/")[0], base, publish, tokens, steps)
    return meta, {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def config(**kw):
    return LedgerConfig(embeddings=frozenset({"emb"}), **kw)


def rel_diff(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a) / max(float(np.max(np.abs(a[k]))) for k in a)


def test_outcomes_and_counters():
    led = Ledger(params(), config(window=2))
    a1, b1, c2 = update("a/1", 0, 0), update("b/1", 0, 0), update("c/2", 0, 1)
    assert led.add(*a1) is Outcome.APPLIED_OPEN
    assert led.add(*c2) is Outcome.HELD_FUTURE  # its sender had closed slot 1 already
    assert led.held_future() == {2: 1}
    assert led.add(*a1) is Outcome.DUPLICATE
    assert led.add(*c2) is Outcome.DUPLICATE  # held ids are seen too
    closed = led.close_slot()
    assert (closed.slot, closed.updates, closed.released) == (1, 1, 1)
    assert led.updates_in_open_slot() == 1 and led.held_future() == {}
    assert led.add(*b1) is Outcome.FOLDED_LATE
    assert led.applied_ids(1) == sorted([a1[0].update_id, b1[0].update_id])
    for _ in range(3):
        led.close_slot()
    assert (led.slot, led.base_slot) == (4, 2)
    assert led.add(*update("d/1", 0, 0)) is Outcome.APPLIED_STALE  # slot 1 left the window
    assert led.add(*update("e/3", 1, 2)) is Outcome.FOLDED_LATE  # slot 3 is still in it
    assert led.counters == {
        "applied-open": 1,
        "folded-late": 2,
        "applied-stale": 1,
        "dropped-stale": 0,
        "dropped-surplus": 0,
        "duplicate": 2,
        "held-future": 1,
        "released": 1,
        "orphaned": 0,
        "evicted": 0,
    }


def test_drop_policy_counts_and_remembers():
    led = Ledger(params(), config(window=0, stale_policy=StalePolicy.DROP))
    led.close_slot()
    late = update("a/1", 0, 0)
    assert led.add(*late) is Outcome.DROPPED_STALE  # W = 0: a closed slot never takes updates
    assert led.add(*late) is Outcome.DUPLICATE
    assert led.counters["dropped-stale"] == 1 and led.updates_in_open_slot() == 0


def test_stale_update_is_weighted_from_the_open_slot():
    """Applied at open slot 5 with staleness 5 − 1 − base; same result as an on-time update with that header."""
    cfg = config(window=1)
    late = Ledger(params(), cfg)
    twin = Ledger(params(), cfg)
    m, d = update("a/1", 0, 0)
    for led in (late, twin):
        for _ in range(4):
            led.close_slot()
    assert late.add(m, d) is Outcome.APPLIED_STALE
    fresh = UpdateMeta(m.update_id, m.origin, 0, 4, m.tokens, m.inner_steps)  # same slot 5, staleness 4
    assert twin.add(fresh, d) is Outcome.APPLIED_OPEN
    late.close_slot()
    twin.close_slot()
    assert late.params_digest() == twin.params_digest()


def test_late_fold_equals_in_order_reference_with_lr_schedule():
    cfg = config(window=3, lr_schedule=lambda t: 0.7 / (1 + 0.1 * t))
    ups = [update(f"{o}/{r}", max(0, r - 2), r - 1) for r in range(1, 6) for o in "abc"]
    ref = Ledger(params(), cfg)
    for r in range(1, 6):
        for u in ups:
            if u[0].target_slot == r:
                ref.add(*u)
        ref.close_slot()
    late = [u for u in ups if u[0].origin != "a" and u[0].target_slot >= 3]  # slots 3..5 stay in the window
    late_ids = {m.update_id for m, _ in late}
    led = Ledger(params(), cfg)
    for r in range(1, 6):
        for u in ups:
            if u[0].target_slot == r and u[0].update_id not in late_ids:
                led.add(*u)
        led.close_slot()
    for u in reversed(late):  # arrive after slot 5 closed, newest first
        assert led.add(*u) is Outcome.FOLDED_LATE
    assert rel_diff(led.params(np.float64), ref.params(np.float64)) < 1e-6  # float32 state: fold rounding
    assert rel_diff(led.momentum(np.float64), ref.momentum(np.float64)) < 1e-6
    assert led.params_digest() == ref.params_digest()
    assert led.params_digest() == ref.params_digest()
    assert led.ledger_digest() == ref.ledger_digest()


def test_validation_errors_leave_no_trace():
    led = Ledger(params(), config(max_future_slots=3))
    before = (led.ledger_digest(), led.params_digest(), led.counters)
    m, d = update("a/1", 0, 0)
    cases = [
        (UpdateMeta(m.update_id, "a", 0, 5, 1, 1), d, Reason.BAD_SLOT),  # slot 6 > open 1 + 3
        (m, {"w": d["w"]}, Reason.SHAPE_MISMATCH),
        (m, {**d, "w": np.zeros((2, 3), np.float32)}, Reason.SHAPE_MISMATCH),
        (m, {**d, "emb": np.array([0, np.nan, 0, 0], np.float32)}, Reason.NON_FINITE),
        (m, {**d, "w": np.full((3, 2), np.inf, np.float32)}, Reason.NON_FINITE),
    ]
    for meta, deltas, reason in cases:
        with pytest.raises(RemoteProtocolError) as err:
            led.add(meta, deltas)
        assert err.value.reason is reason
    with pytest.raises(LocalProtocolError):
        led.add(m, {**d, "w": d["w"].astype(np.float64)})  # dequantize to float32 first
    assert (led.ledger_digest(), led.params_digest(), led.counters) == before
    assert not led.has_seen(m.update_id)
    assert led.add(m, d) is Outcome.APPLIED_OPEN


def test_deltas_are_adopted_read_only_or_copied():
    led, twin = Ledger(params(), config()), Ledger(params(), config())
    m, d = update("a/1", 0, 0)
    backing = np.array(d["w"].T)  # d["w"] below is a (non-owning) view of it: copied
    view = {**d, "w": backing.T}
    assert view["w"].flags.owndata is False and np.array_equal(view["w"], d["w"])
    led.add(m, view)
    twin.add(m, {k: v.copy() for k, v in d.items()})
    assert view["emb"].flags.writeable is False  # adopted: the caller may no longer write it
    with pytest.raises(ValueError):
        view["emb"][0] = 1e6
    backing[...] = 1e6  # the copied view's memory changes: the ledger does not see it
    led.close_slot()
    twin.close_slot()
    assert led.params_digest() == twin.params_digest()
    # a refused update leaves the caller's arrays writable
    bad = {k: v.copy() for k, v in d.items()}
    bad["w"][0, 0] = np.nan
    with pytest.raises(RemoteProtocolError):
        led.add(update("b/2", 1, 1)[0], bad)
    assert bad["emb"].flags.writeable


def test_digests_track_the_set_and_the_slot_count():
    a, b = Ledger(params(), config()), Ledger(params(), config())
    assert a.ledger_digest() == b.ledger_digest() and a.params_digest() == b.params_digest()
    a.add(*update("x/1", 0, 0))
    assert a.ledger_digest() != b.ledger_digest()
    b.add(*update("y/1", 0, 0))
    assert a.ledger_digest() != b.ledger_digest()
    b.add(*update("x/1", 0, 0))
    a.add(*update("y/1", 0, 0))
    assert a.ledger_digest() == b.ledger_digest()
    a.close_slot()
    assert a.ledger_digest() != b.ledger_digest() and a.params_digest() != b.params_digest()
    b.close_slot()
    assert a.params_digest() == b.params_digest()
    for _ in range(6):  # digests survive slots leaving the window (chain)
        a.close_slot()
        b.close_slot()
    assert a.ledger_digest() == b.ledger_digest()


def test_the_bottom_moves_when_read_and_several_slots_in_one_sweep():
    """A close leaves the step of the window bottom's arrays for later; one sweep over several final slots
    gives the bits of one step per close, and every reader of the bottom advances it first."""
    every, lazy = Ledger(params(), config(window=1)), Ledger(params(), config(window=1))
    stepped = []
    for s in range(1, 6):
        for led in (every, lazy):
            led.add(*update(f"a/{s}", s - 1, s - 1))
            led.add(*update(f"b/{s}", max(0, s - 2), s - 1))
            if s > 1:
                led.add(*update(f"late/{s}", s - 2, s - 2))  # folded into the newest closed slot
            led.close_slot()
        stepped.append(every.advance_bottom())
        assert every.bottom_behind == 0
    assert stepped == [0, 1, 1, 1, 1]
    assert (lazy.slot, lazy.base_slot, lazy.bottom_behind) == (5, 4, 4)  # logically at slot 4, arrays at 0
    assert lazy.ledger_digest() == every.ledger_digest()  # the chain moved with the window
    assert lazy.params_digest() == every.params_digest()  # read: four slots stepped in one sweep
    assert lazy.bottom_behind == 0 and lazy.advance_bottom() == 0
    assert lazy.snapshot().to_bytes() == every.snapshot().to_bytes()
    for a, b in zip(lazy.canonical_state(), every.canonical_state()):
        assert all(np.array_equal(a[k], b[k]) for k in SHAPES)


def test_initial_momentum_and_resync():
    mom = {k: np.full(s, 0.5) for k, s in SHAPES.items()}
    led = Ledger(params(), config(), momentum=mom)
    np.testing.assert_array_equal(led.momentum()["w"], mom["w"])
    led.close_slot()  # empty slot: v = μ v, θ −= η μ v
    np.testing.assert_allclose(led.momentum()["w"], 0.45)
    np.testing.assert_allclose(led.params(np.float64)["w"], params()["w"].astype(np.float64) - 0.7 * 0.9 * 0.45)
    led.add(*update("a/0", 0, 0))  # late for slot 1
    led.resync()
    theta, v = led.canonical_state()
    assert all(np.array_equal(led.params(np.float64)[k], theta[k]) for k in SHAPES)
    with pytest.raises(LocalProtocolError):
        Ledger(params(), config(), momentum={"w": np.zeros((3, 2))})
    with pytest.raises(LocalProtocolError):
        led.applied_ids(0)


def test_the_runs_last_slot_takes_nothing_after_it():
    """`end_slot`: no update enters a later slot (refused from its slot alone, nothing changed or remembered),
    no slot after it closes, and a snapshot past it is refused: replicas of a run with an end end alike."""
    led = Ledger(params(), config(window=1, end_slot=2))
    assert led.add(*update("a/1", 0, 0)) is Outcome.APPLIED_OPEN
    with pytest.raises(RemoteProtocolError) as refused:
        led.add(*update("b/3", 1, 2))  # its sender had closed slot 2: it would enter slot 3
    assert refused.value.reason is Reason.PAST_END
    assert led.add(*update("c/2", 0, 1)) is Outcome.HELD_FUTURE
    led.close_slot()
    led.close_slot()
    assert led.slot == 2
    with pytest.raises(LocalProtocolError, match="after the run's last slot"):
        led.close_slot()
    with pytest.raises(RemoteProtocolError) as stale:  # its slot left the window: it would enter the open slot 3
        led.add(*update("d/1", 0, 0))
    assert stale.value.reason is Reason.PAST_END
    assert led.add(*update("e/2", 1, 1)) is Outcome.FOLDED_LATE  # slot 2 is the last one: still taken
    assert update("b/3", 1, 2)[0].update_id not in led.seen_ids()  # refused, so not remembered
    assert config(end_slot=2).fingerprint()["end_slot"] == 2 and config().fingerprint()["end_slot"] is None
