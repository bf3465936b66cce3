"""Late folds into the newest closed slot's kept float32 sum (`protocol.ledger.slot.LiveSlot.fold`) when the
late update takes a term away — it displaces its origin's first update of the slot: the slot's payloads are read
once, by the fast estimate of the new set's screen sums (`protocol.ledger.aggregate.screen_estimate`), whose
bounds prove that the screen keeps everyone and give the new norm — not by the screen's exact pass, not again
to rebuild the old sum or to measure the new one; a displacing update the screen leaves out takes the exact
pass and ends in the canonical bits; without a screen, the guard that rebuilds when what is left is too small
for the rounding the kept sum carries; and a late update that changes nothing (its origin's larger id) makes
no pass at all."""

import hashlib
import importlib

import numpy as np

from protocol.ledger import Ledger, LedgerConfig, Outcome, UpdateMeta

slot_module = importlib.import_module("protocol.ledger.slot")
ledger_module = importlib.import_module("protocol.ledger.ledger")
aggregate_module = importlib.import_module("protocol.ledger.aggregate")

SHAPES = {"emb": (64, 8), "w": (300, 300)}


def _meta(origin: str, slot: int, smaller_than: bytes | None = None, larger_than: bytes | None = None) -> UpdateMeta:
    """An update header of ``origin``, its id below ``smaller_than`` (or above ``larger_than``) if given."""
    for n in range(10_000):
        update_id = hashlib.sha256(f"{origin}/{slot}/{n}".encode()).digest()
        if (smaller_than is None or update_id < smaller_than) and (larger_than is None or update_id > larger_than):
            return UpdateMeta(update_id, origin, slot, slot, 100, 10)
    raise AssertionError("no such id")


def _relative_gap(ledger: Ledger) -> float:
    theta, _ = ledger.canonical_state()
    working = ledger.params(np.float64)
    return max(float(np.max(np.abs(working[k] - theta[k])) / np.max(np.abs(theta[k]))) for k in SHAPES)


def _count_calls(monkeypatch, module, name: str) -> list[int]:
    calls, original = [], getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def _slot_of_four(config: LedgerConfig, deltas_of) -> tuple[Ledger, dict[str, UpdateMeta]]:
    """A ledger whose slot 1 closed with one update from each of four origins."""
    led = Ledger({k: np.zeros(s, np.float32) for k, s in SHAPES.items()}, config)
    first = {}
    for peer in range(4):
        first[f"p{peer}"] = _meta(f"p{peer}", 0)
        assert led.add(first[f"p{peer}"], deltas_of(peer)) is Outcome.APPLIED_OPEN
    led.close_slot()
    return led, first


def _honest(seed: int):
    """A shared direction and a maker of honest updates around it (each call: the direction plus noise)."""
    rng = np.random.default_rng(seed)
    direction = {k: 2.0 * rng.standard_normal(s) for k, s in SHAPES.items()}

    def honest(_peer):
        return {k: (direction[k] + rng.standard_normal(s)).astype(np.float32) for k, s in SHAPES.items()}

    return direction, honest


def _same_bits_as_on_time(led: Ledger, slot: int) -> bool:
    """Whether ``led``'s canonical state has the bits of a replica that got slot ``slot``'s set before its
    close, in decreasing id order."""
    entries = sorted(led._slots[slot].entries, key=lambda e: e.meta.update_id, reverse=True)
    replica = Ledger({k: np.zeros(s, np.float32) for k, s in SHAPES.items()}, led.config)
    for entry in entries:
        replica.add(entry.meta, {k: np.asarray(entry.deltas[k]) for k in SHAPES})
    replica.close_slot()
    return all(np.array_equal(mine[k], theirs[k]) for mine, theirs in
               zip(led.canonical_state(), replica.canonical_state(), strict=True) for k in SHAPES)


def test_a_late_update_that_displaces_its_origins_first_reads_the_slots_payloads_once(monkeypatch):
    _, honest = _honest(5)

    led, first = _slot_of_four(LedgerConfig(window=3, embeddings=frozenset({"emb"})), honest)
    screen_passes = _count_calls(monkeypatch, aggregate_module, "screen_pass")  # the screen's exact pass
    estimates = _count_calls(monkeypatch, slot_module, "screen_estimate")  # its fast estimate
    summed_again = _count_calls(monkeypatch, aggregate_module, "canonical_spans")  # a sum without the screen
    measured = []  # tensors whose new norm took a pass of its own (over the kept sum and the changed terms)
    original = slot_module.norm_with_terms
    monkeypatch.setattr(slot_module, "norm_with_terms", lambda u, name, terms: measured.append(name) or
                        original(u, name, terms))
    displacing = _meta("p1", 0, smaller_than=first["p1"].update_id)
    assert led.add(displacing, honest(1)) is Outcome.FOLDED_LATE
    assert len(estimates) == len(SHAPES), "one fast pass over the slot's payloads per tensor"
    assert not screen_passes, "the estimate's bounds prove the verdict: no exact pass"
    assert not summed_again, "the fold summed the slot's payloads a second time"
    assert not measured, "the new norm comes from the estimate of the new set"
    slot = led._slots[1]  # within 1e-9 of the canonical norm of the new set
    canonical = {k: np.empty(s) for k, s in SHAPES.items()}
    norms = aggregate_module.accumulate_sorted(slot.entries, slot.config, canonical)
    assert all(abs(slot.kept[k][1] - norms[k]) <= 1e-9 * norms[k] for k in SHAPES)
    assert led.applied_ids(1) == sorted([m.update_id for m in first.values()] + [displacing.update_id])
    assert _relative_gap(led) < 1e-6  # the working state, folded in float32, against the canonical replay
    assert _same_bits_as_on_time(led, 1)

    folds = _count_calls(monkeypatch, ledger_module, "fold_change")
    rebuilt = _count_calls(monkeypatch, slot_module, "accumulate_sorted")
    before = led.params()
    assert led.add(_meta("p2", 0, larger_than=first["p2"].update_id), honest(2)) is Outcome.FOLDED_LATE
    assert not folds and not rebuilt  # counts for nothing (its origin's first update has the smaller id)
    assert all(np.array_equal(led.params()[k], before[k]) for k in SHAPES)


def test_a_displacing_update_the_screen_leaves_out_takes_the_exact_pass_and_the_canonical_bits(monkeypatch):
    direction, honest = _honest(7)
    led, first = _slot_of_four(LedgerConfig(window=3, embeddings=frozenset({"emb"})), honest)
    screen_passes = _count_calls(monkeypatch, aggregate_module, "screen_pass")
    negated = {k: (-direction[k]).astype(np.float32) for k in SHAPES}
    displacing = _meta("p1", 0, smaller_than=first["p1"].update_id)
    assert led.add(displacing, negated) is Outcome.FOLDED_LATE
    assert screen_passes, "bounds that cannot prove the verdict leave it to the exact pass"
    slot = led._slots[1]
    assert slot.terms("w").coefficients[displacing.update_id] == 0.0, "the negated update is screened out"
    assert _same_bits_as_on_time(led, 1)


def test_a_kept_sum_left_too_small_for_its_rounding_is_rebuilt(monkeypatch):
    """No screen and no bound: the slot's sum is the plain weighted sum of its updates' directions (the radial
    tensor ``w``). Three origins send ``x`` and one ``-x``; the displacing update of one ``x`` origin sends
    ``-x`` but for a 1e-4 part, so the sum left is ~1e-4 of its terms and the kept sum's float32 rounding
    (of terms ~1e4 times larger) would turn its direction: the fold rebuilds the sum in float64 instead,
    ending in the bits of a ledger that never folds in a kept sum."""
    rng = np.random.default_rng(11)
    base = {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}
    nearly_cancelling = {k: (-x + 1e-4 * rng.standard_normal(x.shape)).astype(np.float32) for k, x in base.items()}

    def update(peer):
        return {k: (-x if peer == 3 else x).astype(np.float32) for k, x in base.items()}

    config = LedgerConfig(window=3, embeddings=frozenset({"emb"}), norm_clip=0.0, direction_screen=None)
    results = []
    for condition in (slot_module.KEPT_CONDITION, 0.0):  # 0: every fold rebuilds
        monkeypatch.setattr(slot_module, "KEPT_CONDITION", condition)
        led, first = _slot_of_four(config, update)
        rebuilt = _count_calls(monkeypatch, slot_module, "accumulate_sorted")
        displacing = _meta("p1", 0, smaller_than=first["p1"].update_id)
        assert led.add(displacing, nearly_cancelling) is Outcome.FOLDED_LATE
        assert rebuilt, "the nearly cancelling sum was folded in the kept float32 sum"
        monkeypatch.undo()
        results.append(led.params())
    assert all(np.array_equal(results[0][k], results[1][k]) for k in SHAPES)
