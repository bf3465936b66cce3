"""Weights from the header and slot aggregates (mean, radial-directional, embeddings), canonical order."""

import hashlib
import itertools
import math

import numpy as np
import pytest

from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Aggregation, LedgerConfig, UpdateMeta, Weighting, aggregate, staleness, update_weight
from protocol.ledger.aggregate import ScreenCache, SlotEntry, accumulate_sorted, tensor_terms
from protocol.ledger.chunks import CHUNK, copy_with_norm, tensor_norm
from protocol.ledger.bound import check_claim
from protocol.ledger.weights import check_meta


def meta(tag="a", base=0, publish=0, tokens=100, steps=10):
    return UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, tokens, steps)


def entry(tag, weight, **arrays):
    deltas = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
    return SlotEntry(meta(tag), 1, weight, deltas, {k: tensor_norm(v) for k, v in deltas.items()})


def test_slot_and_staleness_come_from_the_header():
    m = meta(base=3, publish=5)
    assert m.target_slot == 6
    assert staleness(m, 6) == 2  # applied at its own slot: publish − base
    assert staleness(m, 9) == 5  # applied late at the open slot 9 (stale policy "apply")


def test_weights():
    m = meta(base=3, publish=6, tokens=400, steps=8)  # staleness 3 at slot 7
    assert update_weight(m, 7, LedgerConfig()) == pytest.approx(400 / 2.0)  # (1+3)^-0.5
    assert update_weight(m, 7, LedgerConfig(staleness_alpha=1.0)) == pytest.approx(100.0)
    assert update_weight(m, 7, LedgerConfig(staleness_alpha=0.0)) == 400.0
    assert update_weight(m, 7, LedgerConfig(weighting=Weighting.TOKENS_PER_STEP, staleness_alpha=0.0)) == 400 * 50
    assert update_weight(m, 7, LedgerConfig(weighting="uniform")) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "bad,reason",
    [
        (dict(base=2, publish=1), Reason.BAD_SLOT),
        (dict(base=-1, publish=1), Reason.BAD_SLOT),
        (dict(tokens=0), Reason.BAD_SCHEMA),
        (dict(steps=0), Reason.BAD_SCHEMA),
    ],
)
def test_bad_headers_are_remote_errors(bad, reason):
    with pytest.raises(RemoteProtocolError) as err:
        check_meta(meta(**bad))
    assert err.value.reason is reason
    with pytest.raises(RemoteProtocolError):
        check_meta(UpdateMeta(b"short", "x", 0, 0, 1, 1))


UNBOUNDED = LedgerConfig(norm_clip=0.0)  # the aggregate's math without the norm bound (protocol.ledger.bound)


def test_radial_directional_by_hand():
    # Δ1 = (3, 4) (norm 5), Δ2 = (0, 1) (norm 1), equal weights: mean norm 3, direction ∝ (0.6, 0.8) + (0, 1)
    es = [entry("a", 1.0, w=[3.0, 4.0]), entry("b", 1.0, w=[0.0, 1.0])]
    g = aggregate(es, {"w": (2,)}, UNBOUNDED)["w"]
    d = np.array([0.6, 1.8])
    np.testing.assert_allclose(g, 3.0 * d / np.linalg.norm(d), rtol=1e-15)
    # weights 3:1 → mean norm (15 + 1)/4 = 4, direction ∝ 3·(0.6, 0.8) + (0, 1)
    es = [entry("a", 3.0, w=[3.0, 4.0]), entry("b", 1.0, w=[0.0, 1.0])]
    g = aggregate(es, {"w": (2,)}, UNBOUNDED)["w"]
    d = np.array([1.8, 3.4])
    np.testing.assert_allclose(g, 4.0 * d / np.linalg.norm(d), rtol=1e-15)
    # bounded: the lower median norm (by count, not weight) is b's 1, so a enters with norm τ = k·1:
    # mean clipped norm (3·k + 1)/4, the same direction (a's unit vector is unchanged)
    for k in (1.0, 2.0):
        g = aggregate(es, {"w": (2,)}, LedgerConfig(norm_clip=k))["w"]
        np.testing.assert_allclose(g, (3 * k + 1) / 4 * d / np.linalg.norm(d), rtol=1e-15)


def test_mean_and_embeddings():
    es = [entry("a", 3.0, w=[3.0, 4.0], emb=[1.0]), entry("b", 1.0, w=[0.0, 1.0], emb=[5.0])]
    shapes = {"w": (2,), "emb": (1,)}
    mean = aggregate(es, shapes, LedgerConfig(aggregation=Aggregation.MEAN, norm_clip=0.0))
    np.testing.assert_allclose(mean["w"], [9.0 / 4, 13.0 / 4], rtol=1e-15)
    np.testing.assert_allclose(mean["emb"], [2.0], rtol=1e-15)
    radial = aggregate(es, shapes, LedgerConfig(embeddings=frozenset({"emb"}), norm_clip=0.0))
    np.testing.assert_allclose(radial["emb"], [2.0], rtol=1e-15)  # plain weighted mean
    # without the embedding exemption a 1-element tensor keeps its mean norm and the mean sign
    np.testing.assert_allclose(aggregate(es, shapes, UNBOUNDED)["emb"], [2.0], rtol=1e-15)


def test_zero_and_empty_slots():
    shapes = {"w": (2,)}
    assert np.array_equal(aggregate([], shapes, LedgerConfig())["w"], [0.0, 0.0])
    assert np.array_equal(aggregate([], shapes, LedgerConfig(aggregation="mean"))["w"], [0.0, 0.0])
    # a zero update adds no direction but halves the mean norm
    es = [entry("a", 1.0, w=[3.0, 4.0]), entry("b", 1.0, w=[0.0, 0.0])]
    np.testing.assert_allclose(aggregate(es, shapes, UNBOUNDED)["w"], [1.5, 2.0], rtol=1e-15)
    # bounded, the zero update is the lower median: τ = 0 and the slot moves nothing
    assert np.array_equal(aggregate(es, shapes, LedgerConfig())["w"], [0.0, 0.0])
    # opposite directions cancel exactly: zero aggregate, not NaN
    es = [entry("a", 1.0, w=[3.0, 4.0]), entry("b", 1.0, w=[-3.0, -4.0])]
    assert np.array_equal(aggregate(es, shapes, LedgerConfig())["w"], [0.0, 0.0])


@pytest.mark.parametrize("aggregation", list(Aggregation))
def test_aggregate_bits_do_not_depend_on_entry_order(aggregation):
    rng = np.random.default_rng(7)
    shapes = {"big": (CHUNK + 1001,), "m": (7, 3)}  # crosses a chunk boundary
    es = [
        entry(
            f"u{i}",
            float(rng.uniform(0.1, 10.0)),
            **{k: rng.standard_normal(s) * 10.0 ** rng.integers(-6, 6) for k, s in shapes.items()},
        )
        for i in range(5)
    ]
    config = LedgerConfig(aggregation=aggregation, norm_clip=0.0)
    first = aggregate(es, shapes, config)
    for perm in itertools.islice(itertools.permutations(es), 1, 30, 7):
        again = aggregate(list(perm), shapes, config)
        for name in shapes:
            assert again[name].tobytes() == first[name].tobytes()
    # and the value is right (float64 reference, sum in any order)
    for name in shapes:
        xs = [e.deltas[name].astype(np.float64) for e in es]
        ws = np.array([e.weight for e in es])
        if aggregation is Aggregation.MEAN:
            ref = sum(w * x for w, x in zip(ws, xs, strict=True)) / ws.sum()
        else:
            d = sum(w * x / np.linalg.norm(x) for w, x in zip(ws, xs, strict=True))
            ref = (
                d / np.linalg.norm(d) * sum(w * np.linalg.norm(x) for w, x in zip(ws, xs, strict=True)) / ws.sum()
            )
        np.testing.assert_allclose(first[name], ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max())


def test_norms_and_copies():
    x = np.random.default_rng(3).standard_normal(3 * CHUNK + 5).astype(np.float32)
    copy, norm = copy_with_norm(x)
    assert copy is not x and np.array_equal(copy, x)
    assert norm == tensor_norm(x)
    assert norm == pytest.approx(math.sqrt(float(np.sum(x.astype(np.float64) ** 2))), rel=1e-14)
    fortran = np.asfortranarray(np.ones((4, 3), np.float32))
    assert copy_with_norm(fortran)[0].flags.c_contiguous
    assert not math.isfinite(tensor_norm(np.array([1.0, np.nan], np.float32)))
    assert not math.isfinite(tensor_norm(np.array([np.inf], np.float32)))


def test_one_update_per_origin_counts_the_smallest_id():
    a1, a2 = meta("a1"), meta("a2")
    first, second = sorted([a1, a2], key=lambda m: m.update_id)
    same_origin = [
        SlotEntry(UpdateMeta(first.update_id, "a", 0, 0, 100, 10), 1, 1.0, {"w": np.float32([[3.0, 4.0]])[0]}, {"w": 5.0}),
        SlotEntry(UpdateMeta(second.update_id, "a", 0, 0, 100, 10), 1, 1.0, {"w": np.float32([[0.0, -9.0]])[0]}, {"w": 9.0}),
    ]
    alone = aggregate(same_origin[:1], {"w": (2,)}, LedgerConfig())["w"]
    for order in (same_origin, same_origin[::-1]):
        assert np.array_equal(aggregate(order, {"w": (2,)}, LedgerConfig())["w"], alone)
    np.testing.assert_allclose(alone, [3.0, 4.0], rtol=1e-15)


@pytest.mark.parametrize("aggregation", list(Aggregation))
def test_a_huge_update_counts_at_most_norm_clip_times_the_median(aggregation):
    """Three honest updates (a shared direction plus noise, as pseudo-gradients of one model are) and one
    ×10⁴: the bounded slot moves the tensor by at most an honest update's norm; unbounded, by ~2,500 of
    them. Scaled, it is clipped; negated, the direction screen also leaves it out."""
    rng = np.random.default_rng(5)
    shared = rng.standard_normal(64)
    honest = [shared + 0.5 * rng.standard_normal(64) for _ in range(3)]
    honest_norm = max(float(np.linalg.norm(x)) for x in honest)
    for sign in (1.0, -1.0):
        es = [entry(f"h{i}", 1.0, w=x) for i, x in enumerate(honest)] + [entry("evil", 1.0, w=sign * 1e4 * honest[0])]
        bounded = aggregate(es, {"w": (64,)}, LedgerConfig(aggregation=aggregation))["w"]
        unbounded = aggregate(es, {"w": (64,)}, LedgerConfig(aggregation=aggregation, norm_clip=0.0))["w"]
        assert np.linalg.norm(bounded) <= honest_norm
        assert np.linalg.norm(unbounded) >= 1000.0 * honest_norm
    # the negated one is screened out: the slot is the honest slot's
    assert aggregate(es, {"w": (64,)}, LedgerConfig(aggregation=aggregation))["w"].tobytes() == \
        aggregate(es[:3], {"w": (64,)}, LedgerConfig(aggregation=aggregation))["w"].tobytes()
    # an honest slot (norms within 2× of each other, directions agreeing) is not changed by a bound of 2
    assert aggregate(es[:3], {"w": (64,)}, LedgerConfig(aggregation=aggregation, norm_clip=2.0))["w"].tobytes() == \
        aggregate(es[:3], {"w": (64,)}, LedgerConfig(aggregation=aggregation, norm_clip=0.0))["w"].tobytes()


def test_the_direction_screen_leaves_out_a_random_direction_but_never_the_majority():
    rng = np.random.default_rng(11)
    shared = rng.standard_normal(4096)
    honest = [shared + rng.standard_normal(4096) for _ in range(3)]
    noise = rng.standard_normal(4096)
    es = [entry(f"h{i}", 1.0, w=x) for i, x in enumerate(honest)] + [entry("evil", 1.0, w=noise)]
    terms = tensor_terms(es, "w", LedgerConfig())
    assert terms.coefficients[meta("evil").update_id] == 0.0
    assert all(terms.coefficients[meta(f"h{i}").update_id] > 0.0 for i in range(3))
    # two against two: more than half always stay (at most one is left out)
    es = [entry("h0", 1.0, w=honest[0]), entry("h1", 1.0, w=honest[1]),
          entry("e0", 1.0, w=-honest[0]), entry("e1", 1.0, w=-honest[1])]
    assert sum(c == 0.0 for c in tensor_terms(es, "w", LedgerConfig()).coefficients.values()) <= 1
    # one negated among three: it pulls the others' sums apart, so taken all at once every update "disagreed"
    # and nobody was left out; one at a time, the negated one goes first, and the two honest ones stay
    es = [entry("h0", 1.0, w=honest[0]), entry("h1", 1.0, w=honest[1]), entry("evil", 1.0, w=-honest[2])]
    terms = tensor_terms(es, "w", LedgerConfig())
    assert terms.coefficients[meta("evil").update_id] == 0.0
    assert terms.coefficients[meta("h0").update_id] > 0.0 and terms.coefficients[meta("h1").update_id] > 0.0
    # two that pull apart: neither counts (a step along their difference would be noise); two that agree: both
    es = [entry("h0", 1.0, w=honest[0]), entry("evil", 1.0, w=-honest[1])]
    assert all(c == 0.0 for c in tensor_terms(es, "w", LedgerConfig()).coefficients.values())
    es = [entry("h0", 1.0, w=honest[0]), entry("h1", 1.0, w=honest[1])]
    assert all(c != 0.0 for c in tensor_terms(es, "w", LedgerConfig()).coefficients.values())


@pytest.mark.parametrize("hostile", [False, True])
def test_the_one_pass_sum_with_the_screens_sums_is_the_two_pass_sum(hostile):
    """A close takes the screen's sums in the same pass as U (`_accumulate_with_screen`); the bits of U, its
    norm and the screen's sums are those of screening first, then summing: with no update screened out (U is
    kept), and with one screened out (U is summed again without it)."""
    rng = np.random.default_rng(5)
    shapes = {"big": (2 * CHUNK + 77,), "embed": (9, 5)}
    shared = {k: rng.standard_normal(s) for k, s in shapes.items()}
    es = [entry(f"h{i}", float(rng.uniform(1, 3)), **{k: x + rng.standard_normal(x.shape) for k, x in shared.items()})
          for i in range(3)]
    if hostile:
        es.append(entry("evil", 2.0, **{k: rng.standard_normal(s) for k, s in shapes.items()}))
    for config in (LedgerConfig(), LedgerConfig(embeddings=frozenset({"embed"}))):
        two_pass = ScreenCache()
        for name in shapes:
            tensor_terms(es, name, config, two_pass)  # the screen's sums first: U is then summed in a pass of its own
        out2 = {k: np.empty(s) for k, s in shapes.items()}
        norms2 = accumulate_sorted(es, config, out2, two_pass)
        one_pass = ScreenCache()
        out1 = {k: np.empty(s) for k, s in shapes.items()}
        norms1 = accumulate_sorted(es, config, out1, one_pass)
        assert norms1 == norms2
        for name in shapes:
            assert out1[name].tobytes() == out2[name].tobytes()
            before = tensor_terms(es, name, config, screen=False).coefficients
            live = [(e, before[e.meta.update_id]) for e in sorted(es, key=lambda e: e.meta.update_id)]
            assert one_pass.get(name, live) is not None and one_pass.get(name, live) == two_pass.get(name, live)
        coefficients = tensor_terms(es, "big", config, one_pass).coefficients
        assert [e.meta.origin for e in es if coefficients[e.meta.update_id] == 0.0] == (["evil"] if hostile else [])


def _screened_pairwise(es, name, config):
    """The direction screen evaluated the way PROTOCOL.md defined it before the linear evaluation: from the
    inner products of every pair, ``⟨Δ_i, U_{R−i}⟩ = Σ c_j G_ij`` and ``‖U_{R−i}‖² = Σ c_j c_k G_jk``; of the
    updates that disagree, the one whose leaving leaves the others' mean direction longest goes first."""
    c = tensor_terms(es, name, config, screen=False).coefficients
    live = sorted((e for e in es if c[e.meta.update_id] != 0.0), key=lambda e: e.meta.update_id)
    x = {e.meta.update_id: e.deltas[name].astype(np.float64).reshape(-1) for e in live}
    n = {e.meta.update_id: e.norms[name] for e in live}
    kappa = config.direction_screen
    if len(live) == 2:
        a, b = (e.meta.update_id for e in live)
        return {a, b} if float(x[a] @ x[b]) <= kappa * n[a] * n[b] else set()
    remaining, out = [e.meta.update_id for e in live], set()
    while len(remaining) >= 3 and 2 * (len(remaining) - 1) > len(live):
        disagreeing = []
        for i in remaining:
            rest = sum(c[j] * x[j] for j in remaining if j != i)
            along, rest_sq = float(x[i] @ rest), float(rest @ rest)
            if along <= kappa * n[i] * math.sqrt(rest_sq):  # of these, the one whose leaving leaves most agreement
                agreement = math.sqrt(rest_sq) / sum(c[j] * n[j] for j in remaining if j != i)
                disagreeing.append((-agreement, i))
        if not disagreeing:
            break
        worst = min(disagreeing)[1]
        out.add(worst)
        remaining.remove(worst)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_linear_screen_leaves_out_what_the_pairwise_screen_does(seed):
    """The screen's cosines from ‖U_R‖² and ⟨Δ_i, U_R⟩ (N + 1 inner products) decide as the cosines from every
    pair's inner product (N(N+1)/2) do, on slots of 2 to 12 updates with none to nearly half hostile of
    every kind (negated, random, scaled, a copy of an honest one) and honest ones of unequal weights, over
    the chunk boundary, for the radial and the mean aggregate."""
    rng = np.random.default_rng(seed)
    size = CHUNK + 1000
    shared = rng.standard_normal(size)
    decided = 0
    for trial in range(8):
        m = int(rng.integers(2, 13))
        hostile = 0 if trial % 4 == 0 else int(rng.integers(1, max(2, (m + 1) // 2)))  # some honest-only slots
        honest = [shared + float(rng.uniform(0.5, 3.0)) * rng.standard_normal(size) for _ in range(m - hostile)]
        kinds = [lambda: -honest[0] * 2.0, lambda: rng.standard_normal(size), lambda: honest[-1] * 50.0,
                 lambda: -(shared + rng.standard_normal(size))]
        bad = [kinds[int(rng.integers(len(kinds)))]() for _ in range(hostile)]
        es = [entry(f"s{seed}t{trial}h{i}", float(rng.uniform(1, 4)), w=x) for i, x in enumerate(honest)] + \
             [entry(f"s{seed}t{trial}e{i}", float(rng.uniform(1, 4)), w=x) for i, x in enumerate(bad)]
        for config in (LedgerConfig(), LedgerConfig(embeddings=frozenset({"w"}), norm_clip=2.0)):
            coefficients = tensor_terms(es, "w", config).coefficients
            uncounted = {i for i, c in tensor_terms(es, "w", config, screen=False).coefficients.items() if c == 0.0}
            linear = {i for i, c in coefficients.items() if c == 0.0} - uncounted  # a copy of a copy counts once
            assert linear == _screened_pairwise(es, "w", config)
            decided += bool(linear)
    assert decided >= 8  # the slots put the screen to work, not only honest slots it leaves alone


def test_claims_beyond_the_runs_work_are_refused():
    config = LedgerConfig(tokens_per_step=512, max_inner_steps=50)
    check_claim(meta(tokens=512 * 10, steps=10), config)
    with pytest.raises(RemoteProtocolError) as err:
        check_claim(meta(tokens=512 * 10 + 1, steps=10), config)
    assert err.value.reason is Reason.BAD_CLAIM
    with pytest.raises(RemoteProtocolError) as err:
        check_claim(meta(tokens=512, steps=51), config)
    assert err.value.reason is Reason.BAD_CLAIM
    check_claim(meta(tokens=2**63, steps=10**9), LedgerConfig())  # unchecked when the run sets no limits


def test_directions_that_cancel_make_a_short_step():
    """An update and its negation (the hostile's view of an honest update): unbounded radial-directional
    averaging would scale the leftover of the cancellation (float noise here) up to the mean norm; the
    floor sqrt(Σ w²) keeps the step at the size of that leftover."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal(256)
    y = -x + 1e-3 * rng.standard_normal(256)  # nearly the negation
    es = [entry("h", 1.0, w=x), entry("evil", 1.0, w=y)]
    g = aggregate(es, {"w": (256,)}, LedgerConfig())["w"]
    assert np.linalg.norm(g) <= 1e-2 * np.linalg.norm(x)
    # agreeing updates (positive inner products) are not affected by the floor
    es = [entry("h", 1.0, w=x), entry("k", 1.0, w=x + 0.5 * rng.standard_normal(256))]
    bounded = aggregate(es, {"w": (256,)}, LedgerConfig(norm_clip=2.0))["w"]
    assert bounded.tobytes() == aggregate(es, {"w": (256,)}, UNBOUNDED)["w"].tobytes()


def test_counts_past_2_to_the_53_are_refused_where_they_are_read():
    """A slot or token count that no honest run reaches, and whose arithmetic (powers, weights) would
    overflow or round: refused in a header and in a snapshot field, never an OverflowError later."""
    with pytest.raises(RemoteProtocolError) as err:
        check_meta(meta(publish=2**64 - 1))
    assert err.value.reason is Reason.BAD_SCHEMA
    with pytest.raises(RemoteProtocolError) as err:
        check_meta(meta(tokens=2**53 + 1))
    assert err.value.reason is Reason.BAD_SCHEMA
    check_meta(meta(tokens=2**53))


def test_a_lone_update_is_held_to_what_its_inner_steps_could_do():
    """One update alone in a slot (no median to compare with): its norm enters at most as
    (max_step_rms · inner_steps) · sqrt(size); an honest one, far below that, is unchanged."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(400) * 0.01  # RMS 0.01 after its 10 steps: 0.001 per step
    config = LedgerConfig(max_step_rms=0.004)  # the most a step could do, per element
    honest = aggregate([entry("h", 1.0, w=x)], {"w": (400,)}, config)["w"]
    np.testing.assert_allclose(honest, x, rtol=1e-6)
    evil = aggregate([entry("e", 1.0, w=1e4 * x)], {"w": (400,)}, config)["w"]
    np.testing.assert_allclose(np.linalg.norm(evil), 0.004 * 10 * math.sqrt(400), rtol=1e-12)
    assert np.linalg.norm(aggregate([entry("e", 1.0, w=1e4 * x)], {"w": (400,)}, LedgerConfig())["w"]) > 100
