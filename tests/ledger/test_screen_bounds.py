"""The direction screen's verdict on a late update of a new origin, certified from bounds
(`protocol.ledger.screen_bounds`): a certificate is only given where the screen evaluated in full keeps
everyone, a ledger that certifies ends in the same bits as one that always evaluates, and certificates do
fire on honest slots (the pass they save is real)."""

import hashlib
import math

import numpy as np
import pytest

from protocol.ledger import Ledger, LedgerConfig, Outcome, UpdateMeta
from protocol.ledger.aggregate import ScreenCache, SlotEntry, bound_terms, screen_pass, tensor_terms
from protocol.ledger.chunks import CHUNK, tensor_norm
from protocol.ledger.screen_bounds import ScreenBounds, along_kept, extend, keeps_everyone, kept_interval
from protocol.ledger.slot import LiveSlot

KAPPA = LedgerConfig().direction_screen
SIZE = CHUNK + 1000  # over the chunk boundary


def entry(tag, weight, x):
    w = np.asarray(x, dtype=np.float32)
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, 0, 0, 100, 10)
    return SlotEntry(meta, 1, weight, {"w": w}, {"w": tensor_norm(w)})


def live_terms(entries, config):
    coefficients = tensor_terms(entries, "w", config, screen=False).coefficients
    return [(e, coefficients[e.meta.update_id]) for e in sorted(entries, key=lambda e: e.meta.update_id)
            if coefficients[e.meta.update_id] != 0.0]


def keeps_all_in_full(entries, config):
    """The screen of `entries` evaluated from its exact sums (a fresh cache): nobody screened out."""
    return all(c != 0.0 for _, c in live_terms(entries, config)) and all(
        tensor_terms(entries, "w", config, ScreenCache()).coefficients[e.meta.update_id] != 0.0
        for e, _ in live_terms(entries, config))


def grown_bounds(old, new, config, kept=None, folds=1, bounds=None):
    """Bounds for `old` + `new` as a ledger's slot derives them: the exact sums of `old` (or `bounds`), the
    float32 kept sum of `old` (or `kept`)."""
    live = live_terms(old, config)
    if bounds is None:
        out = np.empty(SIZE)
        sums = screen_pass(live, "w", SIZE, out)
        bounds = ScreenBounds.exact(sums.u_squared, sums.along, bound_terms(live, "w"))
        kept = out.astype(np.float32) if kept is None else kept
    joined = {e.meta.update_id: c for e, c in live_terms([*old, new], config)}
    terms = bound_terms(live, "w")
    changes = {i: joined[i] - c for i, c, _ in terms if joined.get(i, 0.0) != c}
    if any(joined.get(i, 0.0) == 0.0 for i in changes):
        return None, joined, kept  # a term left the set: never certified (LiveSlot._certify)
    y = along_kept(kept, new.deltas, "w")
    return extend(bounds, terms, (new.meta.update_id, joined[new.meta.update_id], new.norms["w"]),
                  kept_interval(y, new.norms["w"], terms, folds), changes), joined, kept


@pytest.mark.parametrize("aggregation", ["radial", "mean"])
def test_a_certificate_needs_every_cosine_above_kappa_by_the_margin(aggregation):
    """One update built at a cosine of κ + ε to the sum of the others, for ε from just below to well above:
    the exact sums' bounds certify only where the full screen keeps everyone, and do certify at ε = 0.01."""
    config = LedgerConfig() if aggregation == "radial" else LedgerConfig(embeddings=frozenset({"w"}), norm_clip=2.0)
    rng = np.random.default_rng(1)
    shared = rng.standard_normal(SIZE)
    honest = [entry(f"h{i}", 1.0 + i / 4, shared + rng.standard_normal(SIZE)) for i in range(4)]
    rest = sum(c * e.deltas["w"].astype(np.float64) for e, c in live_terms(honest, config))
    unit = rest / np.linalg.norm(rest)
    other = rng.standard_normal(SIZE)
    other -= (other @ unit) * unit
    other /= np.linalg.norm(other)
    scale = float(np.linalg.norm(honest[0].deltas["w"]))
    verdicts = {}
    for eps in (-1e-2, -1e-4, -1e-7, 0.0, 1e-9, 1e-7, 1e-6, 1e-4, 1e-2):
        q = KAPPA + eps
        probe = entry(f"probe{eps}", 1.0, scale * (q * unit + math.sqrt(1 - q * q) * other))
        es = [*honest, probe]
        live = live_terms(es, config)
        sums = screen_pass(live, "w", SIZE)
        certified = keeps_everyone(ScreenBounds.exact(sums.u_squared, sums.along, bound_terms(live, "w")),
                                   bound_terms(live, "w"), KAPPA)
        if certified:
            assert keeps_all_in_full(es, config), eps
        verdicts[eps] = certified
    assert not verdicts[-1e-2] and not verdicts[0.0]
    assert verdicts[1e-2]


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_a_certified_late_update_is_kept_by_the_full_screen_too(seed):
    """Random slots of 2–12 updates, honest ones of every degree of agreement and hostile ones of every kind,
    then one or two late updates of new origins (honest, hostile, or nearly orthogonal), for radial and mean
    tensors (clipped at the median: the late update moves the others' coefficients): whenever the bounds
    (from the exact sums of the slot, its float32 kept sum and one pass over the late update; chained for the
    second) certify, the screen evaluated in full on the grown set keeps everyone."""
    rng = np.random.default_rng(seed)
    certified = refused = moved = 0
    for trial in range(12):
        agreement = float(rng.uniform(0.2, 3.0))  # the shared direction's share: low = nearly orthogonal updates
        shared = agreement * rng.standard_normal(SIZE)
        m = int(rng.integers(2, 13))
        hostile = min(int(rng.integers(0, 3)), m - 1) if trial % 3 else 0
        xs = [shared + rng.standard_normal(SIZE) * float(rng.uniform(0.5, 2.0)) for _ in range(m - hostile)]
        xs += [-2.0 * xs[0] if k % 2 else rng.standard_normal(SIZE) * 3.0 for k in range(hostile)]
        old = [entry(f"s{seed}t{trial}o{i}", float(rng.uniform(1, 4)), x) for i, x in enumerate(xs)]
        lates = [shared + rng.standard_normal(SIZE), -(shared + rng.standard_normal(SIZE)), rng.standard_normal(SIZE)]
        for config in (LedgerConfig(), LedgerConfig(embeddings=frozenset({"w"}), norm_clip=2.0),
                       LedgerConfig(embeddings=frozenset({"w"}))):  # a mean tensor clipped at the median
            if not keeps_all_in_full(old, config):
                continue  # a slot whose screen left someone out is never certified from (LiveSlot._certify)
            first = entry(f"s{seed}t{trial}n1", float(rng.uniform(1, 4)), lates[trial % 3])
            bounds, joined, kept = grown_bounds(old, first, config)
            grown = [*old, first]
            if bounds is not None and keeps_everyone(bounds, bound_terms(live_terms(grown, config), "w"), KAPPA):
                certified += 1
                moved += any(joined[e.meta.update_id] != c for e, c in live_terms(old, config))
                assert keeps_all_in_full(grown, config)
                # a second new origin, from the first certificate's intervals and the kept sum after the fold
                second = entry(f"s{seed}t{trial}n2", float(rng.uniform(1, 4)), shared + rng.standard_normal(SIZE))
                kept2 = sum(c * e.deltas["w"].astype(np.float64) for e, c in live_terms(grown, config)).astype(np.float32)
                chained, _, _ = grown_bounds(grown, second, config, kept=kept2, folds=2, bounds=bounds)
                if chained is not None and keeps_everyone(chained, bound_terms(live_terms([*grown, second], config), "w"), KAPPA):
                    certified += 1
                    assert keeps_all_in_full([*grown, second], config)
            else:
                refused += 1
    assert certified >= 5 and refused >= 3  # both verdicts were put to the test
    assert moved >= 1  # certified where the late update moved the others' clipped coefficients


SHAPES = {"emb": (64, 8), "w": (300, 300)}


def _update(tag, slot, direction, rng, weight_scale=1.0):
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag.split("/")[0], slot, slot, 100, 10)
    return meta, {k: (direction[k] + rng.standard_normal(SHAPES[k])).astype(np.float32) * weight_scale
                  for k in SHAPES}


def _run(certify: bool, monkeypatch) -> tuple[Ledger, list[str]]:
    """Six origins; each slot closes with four of them in it, then the other two arrive late (new origins),
    one slot's late pair led by a negated update. Returns the ledger and the tensors of the certificates given."""
    given = []
    original = ScreenCache.certify

    def counting(self, name, live, bounds, kappa):
        ok = original(self, name, live, bounds, kappa)
        if ok:
            given.append(name)
        return ok

    with monkeypatch.context() as m:
        m.setattr(ScreenCache, "certify", counting)
        if not certify:
            m.setattr(LiveSlot, "_certify", lambda self, name, entry: None)
        rng = np.random.default_rng(7)
        led = Ledger({k: np.zeros(s, np.float32) for k, s in SHAPES.items()},
                     LedgerConfig(window=3, embeddings=frozenset({"emb"})))
        for slot in range(6):
            direction = {k: 2.0 * rng.standard_normal(s) for k, s in SHAPES.items()}
            for peer in range(4):
                assert led.add(*_update(f"p{peer}/{slot}", slot, direction, rng)) is Outcome.APPLIED_OPEN
            led.close_slot()
            for peer in (4, 5):
                meta, deltas = _update(f"p{peer}/{slot}", slot, direction, rng)
                if slot == 3 and peer == 4:
                    deltas = {k: -3.0 * x for k, x in deltas.items()}
                assert led.add(meta, deltas) is Outcome.FOLDED_LATE
        led.close_slot()
    return led, given


def test_a_ledger_that_certifies_ends_in_the_bits_of_one_that_evaluates(monkeypatch):
    certifying, given = _run(True, monkeypatch)
    evaluating, none = _run(False, monkeypatch)
    assert not none
    # the honest late updates were certified without a pass: the radial tensor, and the mean one whose clipped
    # coefficients each late update moves (norm_clip 1: the bound is the median norm)
    assert given.count("w") >= 5 and given.count("emb") >= 3
    assert certifying.params_digest() == evaluating.params_digest()
    assert certifying.ledger_digest() == evaluating.ledger_digest()
    for k, x in evaluating.params().items():
        assert np.array_equal(certifying.params()[k], x)


def test_a_fold_into_the_kept_sum_takes_the_new_norm_from_one_inner_product(monkeypatch):
    """A late update whose term is the only change, folded into the kept float32 sum: the sum's new norm comes
    from the kept norm, ``⟨kept, Δ⟩`` and ``‖Δ‖`` (within 1e-6 of what a pass over ``kept + c·Δ`` measures),
    with the certificate's inner product when it took one, so that such a fold makes no pass over the model
    before its own; one screened out changes nothing and measures nothing. Only the working state reads these
    norms: a ledger that never certifies (and so takes the inner product itself) ends in the same bits."""
    import importlib

    slot_module = importlib.import_module("protocol.ledger.slot")
    original, measure = LiveSlot._norm_from_kept, slot_module.norm_with_terms
    checked, passes = [], []

    def checking(self, name, entry, u, terms, now, norm_old):
        norm = original(self, name, entry, u, terms, now, norm_old)
        if norm is not None:
            checked.append((norm, measure(u, name, terms)))
        return norm

    def counting(u, name, terms):
        passes.append(name)
        return measure(u, name, terms)

    monkeypatch.setattr(LiveSlot, "_norm_from_kept", checking)
    monkeypatch.setattr(slot_module, "norm_with_terms", counting)
    certifying, given = _run(True, monkeypatch)
    assert given.count("w") >= 5 and len(checked) >= 5
    for norm, reference in checked:
        assert norm == pytest.approx(reference, rel=1e-6, abs=0.0)
    assert "w" not in passes  # every late update of the radial tensor: no pass for its norm
    evaluating, _ = _run(False, monkeypatch)
    for k, x in evaluating.params().items():
        assert np.array_equal(certifying.params()[k], x)


def test_a_late_update_that_cancels_the_kept_sum_has_its_norm_measured():
    """``‖u + c·Δ‖`` from ``‖u‖² + 2c⟨u, Δ⟩ + c²‖Δ‖²`` loses digits when the two nearly cancel: below half
    of ``‖u‖² + c²‖Δ‖²`` the fold measures it instead."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(SIZE).astype(np.float32)
    slot = LiveSlot(1, {"w": (SIZE,)}, LedgerConfig())
    slot.keep()
    kept = x.copy()
    slot.set_kept("w", kept, tensor_norm(kept))
    for sign, measured in ((1.0, False), (-1.0, True)):
        late = entry(f"late{sign}", 1.0, sign * x.astype(np.float64))
        terms = [(late.deltas, 1.0)]
        norm = slot._norm_from_kept("w", late, kept, terms, late.deltas, slot.kept["w"][1])
        assert (norm is None) is measured
        if not measured:
            assert norm == pytest.approx(2.0 * tensor_norm(kept), rel=1e-6)
