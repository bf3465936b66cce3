"""One origin's many updates for one slot (`max_updates_per_origin` K, `protocol.ledger.bound`): an origin
with more than K updates in a slot counts for nothing there, a slot keeps only the K + 1 smallest ids of
an origin, and both are functions of the set received, so replicas still agree whatever the order. A
flood of ground ids in decreasing order costs a closed slot at most the folds of a few updates; every
update after that leaves the state's bits alone."""

import dataclasses
import hashlib
import importlib
import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot, Outcome, UpdateMeta
from protocol.ledger.aggregate import SlotEntry, aggregate

ledger_module = importlib.import_module("protocol.ledger.ledger")

SHAPES = {"emb": (6,), "w": (40, 30)}


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def _deltas(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shared = np.random.default_rng(99)
    return {k: (shared.standard_normal(s) + 0.5 * rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}


def _meta(origin: str, n: int, publish_slot: int = 0) -> UpdateMeta:
    return UpdateMeta(hashlib.sha256(f"{origin}/{publish_slot}/{n}".encode()).digest(), origin, publish_slot,
                      publish_slot, 100, 10)


def _flood(origin: str, count: int, publish_slot: int = 0) -> list[UpdateMeta]:
    """``count`` updates of ``origin`` for slot ``publish_slot + 1``, in decreasing id order (a ground flood)."""
    return sorted((_meta(origin, n, publish_slot) for n in range(count)), key=lambda m: m.update_id, reverse=True)


def _entry(meta: UpdateMeta, x: np.ndarray) -> SlotEntry:
    return SlotEntry(meta, 1, 1.0, {"w": x}, {"w": float(np.linalg.norm(x.astype(np.float64)))})


def test_an_origin_with_more_than_k_updates_in_a_slot_counts_for_nothing_there():
    config = LedgerConfig(max_updates_per_origin=2, direction_screen=None)
    honest = _entry(_meta("h", 0), np.float32([1.0, 0.0]))
    a = [_entry(m, np.float32([0.0, 5.0])) for m in sorted((_meta("a", n) for n in range(3)), key=lambda m: m.update_id)]
    alone = aggregate([honest], {"w": (2,)}, config)["w"]
    with_two = aggregate([honest, *a[:2]], {"w": (2,)}, config)["w"]
    with_three = aggregate([honest, *a], {"w": (2,)}, config)["w"]
    assert with_two[1] > 0.0  # two: its smallest id counts
    assert np.array_equal(with_three, alone)  # three: nothing of it
    unlimited = LedgerConfig(max_updates_per_origin=None, direction_screen=None)
    assert np.array_equal(aggregate([honest, *a], {"w": (2,)}, unlimited)["w"],
                          aggregate([honest, a[0]], {"w": (2,)}, unlimited)["w"])  # no limit: the smallest counts


@pytest.mark.parametrize("k", [1, 2, 3])
def test_an_open_slot_keeps_the_k_plus_one_smallest_ids_of_an_origin_whatever_the_order(k):
    config = LedgerConfig(window=2, max_updates_per_origin=k)
    flood = _flood("a", 8)
    smallest = sorted(m.update_id for m in flood)[: k + 1]
    digests = set()
    for order in (flood, flood[::-1], random.Random(k).sample(flood, len(flood))):
        led = Ledger(_params(), config)
        led.add(_meta("h", 0), _deltas(1))
        outcomes = [led.add(m, _deltas(i + 2)) for i, m in enumerate(order)]
        kept = sorted(set(led.applied_ids(1)) - {_meta("h", 0).update_id})
        assert kept == smallest
        counters = led.counters
        assert outcomes.count(Outcome.APPLIED_OPEN) == k + 1 + counters["evicted"]
        assert outcomes.count(Outcome.DROPPED_SURPLUS) == len(flood) - k - 1 - counters["evicted"]
        assert all(led.has_seen(m.update_id) for m in flood)
        assert all(led.add(m, _deltas(0)) is Outcome.DUPLICATE for m in flood)  # evicted or dropped: seen
        led.close_slot()
        digests.add(led.params_digest())
    assert len(digests) == 1


def test_a_flood_of_decreasing_ids_into_a_closed_slot_folds_at_most_k_times_then_changes_no_bit(monkeypatch):
    k = 2
    config = LedgerConfig(window=3, max_updates_per_origin=k, embeddings=frozenset({"emb"}))
    led = Ledger(_params(), config)
    for i, origin in enumerate("pqr"):
        led.add(_meta(origin, 0), _deltas(i))
    led.close_slot()
    folds = []
    original = ledger_module.fold_change
    monkeypatch.setattr(ledger_module, "fold_change", lambda *a, **kw: folds.append(1) or original(*a, **kw))
    flood = _flood("a", 12)
    changed = 0
    for i, meta in enumerate(flood):
        before = led.params()
        outcome = led.add(meta, _deltas(100 + i))
        assert outcome in (Outcome.FOLDED_LATE, Outcome.DROPPED_SURPLUS)
        changed += any(not np.array_equal(before[n], led.params()[n]) for n in SHAPES)
    # the origin joins (1), a smaller id displaces it (2), a third leaves it out for good (3); then nothing
    assert changed <= k + 1
    assert len(folds) <= (k + 1) * len(SHAPES)
    assert len(led.applied_ids(1)) == 3 + k + 1
    evicted = led.take_evicted()
    assert len(evicted) == led.counters["evicted"] == len(flood) - (k + 1)  # decreasing ids: each evicts one
    assert not led.take_evicted()

    # the state is the one of a replica that only ever received the K + 1 smallest, bit for bit
    other = Ledger(_params(), config)
    for i, origin in enumerate("pqr"):
        other.add(_meta(origin, 0), _deltas(i))
    kept = sorted(flood, key=lambda m: m.update_id)[: k + 1]
    for meta in kept:
        other.add(meta, _deltas(100 + flood.index(meta)))
    other.close_slot()
    assert other.params_digest() == led.params_digest()
    assert other.ledger_digest() == led.ledger_digest()


def test_held_future_updates_are_limited_as_well():
    led = Ledger(_params(), LedgerConfig(window=2, max_updates_per_origin=1))
    outcomes = [led.add(m, _deltas(i)) for i, m in enumerate(_flood("a", 5, publish_slot=2))]
    assert outcomes.count(Outcome.HELD_FUTURE) == 5  # decreasing ids: each joins, the largest leaves
    assert led.held_future() == {3: 2}
    assert led.counters["evicted"] == 3


def test_a_snapshot_holding_more_of_one_origin_in_a_slot_than_a_ledger_keeps_is_refused():
    config = LedgerConfig(window=2, max_updates_per_origin=1)
    led = Ledger(_params(), config)
    flood = _flood("a", 3)
    for i, meta in enumerate(flood[1:]):
        led.add(meta, _deltas(i))
    snap = led.snapshot()
    assert Ledger.from_snapshot(LedgerSnapshot.from_bytes(snap.to_bytes()), config).applied_ids(1) == led.applied_ids(1)
    extra = dataclasses.replace(snap.entries[0], meta=flood[0])
    forged = dataclasses.replace(snap, entries=(*snap.entries, extra), seen=tuple(sorted({*snap.seen, flood[0].update_id})))
    with pytest.raises(RemoteProtocolError) as err:
        Ledger.from_snapshot(forged, config)
    assert err.value.reason is Reason.BAD_STATE and "at most 2 of one origin" in str(err.value)


@st.composite
def floods(draw):
    window = draw(st.integers(1, 3))
    k = draw(st.integers(1, 3))
    slots = draw(st.integers(1, 4))
    updates = []
    for r in range(slots):
        for origin in ("h0", "h1", "x"):
            copies = draw(st.integers(0, 6 if origin == "x" else 1))
            metas = [_meta(origin, n, r) for n in range(copies)]
            updates += [(m, _deltas(int.from_bytes(m.update_id[:4], "big"))) for m in metas]
    return window, k, slots, updates


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(case=floods(), order_seed=st.integers(0, 2**31))
def test_replicas_agree_under_floods_whatever_the_order(case, order_seed):
    window, k, slots, updates = case
    config = LedgerConfig(window=window, max_updates_per_origin=k, embeddings=frozenset({"emb"}))

    def replica(order, closes) -> Ledger:
        led = Ledger(_params(), config)
        pending = list(order)
        while pending or led.slot < slots:
            lowest = min((m.target_slot for m, _ in pending), default=slots + window + 1)
            can_close = led.slot < slots and led.slot + 1 - window < lowest
            if pending and (not can_close or closes.random() < 0.6):
                led.add(*pending.pop())
            else:
                led.close_slot()
        return led

    rnd = random.Random(order_seed)
    replicas = [replica(rnd.sample(updates, len(updates)), rnd) for _ in range(3)]
    # the K + 1 smallest ids of each (slot, origin), alone, in order: the same state
    kept = [u for _, group in itertools.groupby(sorted(updates, key=lambda u: (u[0].target_slot, u[0].origin,
                                                                                   u[0].update_id)),
                                                   key=lambda u: (u[0].target_slot, u[0].origin))
            for u in list(group)[: k + 1]]
    reference = replica(sorted(kept, key=lambda u: u[0].update_id, reverse=True), random.Random(0))
    for led in replicas:
        assert led.params_digest() == reference.params_digest()
        assert led.ledger_digest() == reference.ledger_digest()
